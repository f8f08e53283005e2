"""Continue a ``/v1/chat/completions`` answer an abort pause ended, through the token
form (docs/operations.md, "Which routes continue").

vLLM 0.32 answers a chat request with ``return_token_ids`` with the prompt's
token ids (the chat template applied: top-level ``prompt_token_ids``) and each
choice's ``token_ids`` (``vllm/entrypoints/openai/chat_completion/protocol.py``),
abort answers included. So an aborted choice goes on as a token completion:
``POST /v1/completions`` with ``prompt`` = prompt ids + tokens so far,
``max_tokens`` the budget left, ``n: 1``, the chat body's sampling fields and
``logprobs: top_logprobs``; its segments are joined back into the chat choice:
``message.content`` the texts joined, ``logprobs.content`` the entries joined
(the continuation's written as chat entries: ``token``, ``logprob``,
``bytes``, ``top_logprobs``), ``token_ids``, ``finish_reason``/``stop_reason``
of the last segment, ``weight_versions`` spans, ``usage`` over every token.

Replayed whole instead (``None``), because the chat route does more than
sample tokens, or the budget is not known: a request with ``tools``,
``response_format`` or structured outputs (the engine parses the whole message
into tool calls or checks it against a grammar from its first token), an
answer with ``tool_calls`` or ``reasoning``, a request with no
``max_completion_tokens`` / ``max_tokens`` (vLLM gives chat what the model
length leaves, and a completion continuation would get 16), or an answer
without token ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from trioforward.codec import UNVERSIONED
from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._chat import budget_of, chat_entries, tokens_body, top_k
from trioforward.dispatch.rollout._continue import (
    CONTINUABLE_PATH,
    Generation,
    warn_no_token_ids,
)
from trioforward.dispatch.rollout._continue_answer import continue_choice
from trioforward.dispatch.rollout._continuing import continue_aborted, loaded

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["CHAT_PATH", "continued_chat"]

CHAT_PATH = "/v1/chat/completions"


async def continued_chat(dispatcher: Dispatcher, req: Request, reply: Reply) -> Reply | None:
    """The whole chat answer of ``req``, whose answer ``reply`` an abort pause
    ended, made by continuing each aborted choice as a token completion; ``None``
    when it cannot be (see the module): the caller replays it whole."""
    counts = dispatcher.continued
    parsed = loaded(req, reply)
    if parsed is None:
        return None
    body, doc = parsed
    if not isinstance(doc, dict) or not isinstance(body, dict):
        counts.whole += 1
        return None
    budget = budget_of(body)
    choices = doc.get("choices")
    prompt = doc.get("prompt_token_ids")
    if budget is None or not isinstance(choices, list) or not choices:
        counts.whole += 1
        return None
    if not isinstance(prompt, list) or not prompt:
        warn_no_token_ids(counts, reply.engine.url)
        counts.whole += 1
        return None
    gens: list[Generation] = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        ids = choice.get("token_ids") if isinstance(choice, dict) else None
        if not isinstance(message, dict) or message.get("tool_calls") or message.get("reasoning"):
            counts.whole += 1
            return None
        if not isinstance(ids, list):
            warn_no_token_ids(counts, reply.engine.url)
            counts.whole += 1
            return None
        block = choice.get("logprobs")
        base = {
            "token_ids": ids,
            "text": message.get("content") or "",
            # The first segment's entries stay as the engine wrote them; the
            # continuations' are collected here (completion shape) and converted.
            "logprobs": {} if isinstance(block, dict) else None,
            "finish_reason": choice.get("finish_reason"),
            "stop_reason": choice.get("stop_reason"),
        }
        gens.append(Generation(base, prompt, req.weight_version))
    completion = tokens_body(body)
    return await continue_aborted(
        dispatcher,
        reply,
        [g for g in gens if g.finish == "abort"],
        lambda gen, failure: continue_choice(
            dispatcher, req, completion, gen, budget, failure, CONTINUABLE_PATH
        ),
        lambda: _joined(doc, gens, top_k(body), not req.asked_ids),
    )


def _joined(doc: dict[str, Any], gens: list[Generation], k: int, ids: bool) -> bytes:
    out = dict(doc)
    choices = []
    for choice, gen in zip(doc["choices"], gens, strict=True):
        joined = dict(choice)
        joined["message"] = {**choice["message"], "content": gen.text}
        if isinstance(choice.get("logprobs"), dict):
            first = choice["logprobs"].get("content") or []
            joined["logprobs"] = {
                **choice["logprobs"],
                "content": first + chat_entries(gen.logprobs, k),
            }
        joined["finish_reason"] = gen.finish
        joined["stop_reason"] = gen.stop
        joined["token_ids"] = gen.tokens if ids else None
        joined["weight_versions"] = gen.spans or [{"version": UNVERSIONED, "start": 0, "end": 0}]
        choices.append(joined)
    out["choices"] = choices
    if not ids and "prompt_token_ids" in out:
        out["prompt_token_ids"] = None
    use = dict(doc.get("usage") or {})
    prompt = int(use.get("prompt_tokens") or 0)
    completion = sum(len(g.tokens) for g in gens)
    use.update(completion_tokens=completion, total_tokens=prompt + completion)
    out["usage"] = use
    return orjson.dumps(out)
