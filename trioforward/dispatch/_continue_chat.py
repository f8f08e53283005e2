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
from trioforward.dispatch._continue import (
    CONTINUABLE_PATH,
    Generation,
    warn_no_token_ids,
)
from trioforward.dispatch._continue_answer import continue_choice
from trioforward.dispatch._continuing import continue_each
from trioforward.dispatch._outcome import Reply
from trioforward.dispatch._request import Request

if TYPE_CHECKING:
    from trioforward.dispatch._dispatch import Dispatcher

__all__ = ["CHAT_PATH", "continued_chat"]

CHAT_PATH = "/v1/chat/completions"
# Chat body fields a token completion takes as they are (vLLM's sampling fields).
_KEPT = (
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "logit_bias", "bad_words",
    "allowed_token_ids", "include_stop_str_in_output", "user", "priority",
)  # fmt: skip
# Chat features the engine applies to the whole message: not continued.
_WHOLE = (
    "tools", "functions", "response_format", "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar",
)  # fmt: skip


def _chat_entries(block: dict[str, list[Any]] | None, k: int) -> list[dict[str, Any]]:
    """A completion segment's logprobs as chat ``logprobs.content`` entries."""
    if block is None:
        return []
    out = []
    for token, lp, top in zip(
        block["tokens"], block["token_logprobs"], block["top_logprobs"], strict=False
    ):
        tops = list((top or {}).items())[:k]
        out.append(
            {
                "token": token,
                "logprob": lp,
                "bytes": list(str(token).encode()),
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in tops
                ],
            }
        )
    return out


async def continued_chat(dispatcher: Dispatcher, req: Request, reply: Reply) -> Reply | None:
    """The whole chat answer of ``req``, whose answer ``reply`` an abort pause
    ended, made by continuing each aborted choice as a token completion; ``None``
    when it cannot be (see the module): the caller replays it whole."""
    counts = dispatcher.continued
    try:
        doc = orjson.loads(reply.content)
        body = orjson.loads(req.content)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(body, dict) or any(body.get(k) for k in _WHOLE):
        counts.whole += 1
        return None
    budget = body.get("max_completion_tokens", body.get("max_tokens"))
    choices = doc.get("choices")
    prompt = doc.get("prompt_token_ids")
    if type(budget) is not int or not isinstance(choices, list) or not choices:
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
    aborted = [g for g in gens if g.finish == "abort"]
    if not any(g.tokens for g in aborted):
        counts.whole += 1
        return None
    top = body.get("top_logprobs")
    k = top if type(top) is int else 0
    tokens_body = {key: body[key] for key in _KEPT if key in body}
    if body.get("logprobs"):
        tokens_body["logprobs"] = max(k, 1)
    counts.answers += 1
    counts.tokens_kept += sum(len(g.tokens) for g in aborted)
    refused = await continue_each(
        aborted,
        lambda gen, failure: continue_choice(
            dispatcher, req, tokens_body, gen, budget, failure, CONTINUABLE_PATH
        ),
    )
    if refused is not None:
        return refused
    content = _joined(doc, gens, k, not req.asked_ids)
    return Reply(reply.engine, reply.status, reply.headers, content, None, reply.deadline)


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
                "content": first + _chat_entries(gen.logprobs, k),
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
