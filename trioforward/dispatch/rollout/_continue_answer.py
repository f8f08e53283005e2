"""Continue a ``/v1/completions`` answer an abort pause ended (docs/operations.md,
"Continue after an abort pause"): each aborted choice sent again until it ends,
the segments joined (:mod:`._continue` has the pieces)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.rollout._continue import (
    CONTINUABLE_PATH,
    DEFAULT_MAX_TOKENS,
    Generation,
    continuation_body,
    derived,
    is_length_refusal,
    joined_answer,
    warn_no_token_ids,
)
from trioforward.dispatch.rollout._continuing import (
    continue_each,
    count_continuation,
    send_continuation,
)

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["continued_answer", "continue_choice"]


async def continued_answer(dispatcher: Dispatcher, req: Request, reply: Reply) -> Reply | None:
    """The whole answer of ``req``, whose engine answer ``reply`` an abort pause
    ended, made by continuing each aborted choice; ``None`` when it cannot be
    continued (not a token completion, no token ids, nothing generated yet): the
    caller replays it whole. Raises :class:`DispatchAborted` past
    ``max_continuations`` and the dispatch errors of a continuation."""
    counts = dispatcher.continued
    try:
        doc = orjson.loads(reply.content)
        body = orjson.loads(req.content)
    except orjson.JSONDecodeError:
        return None
    if req.url_path != CONTINUABLE_PATH or not isinstance(doc, dict) or not isinstance(body, dict):
        return None
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    gens: list[Generation] = []
    aborted: list[Generation] = []
    for choice in choices:
        ids, prompt = choice.get("token_ids"), choice.get("prompt_token_ids")
        if not isinstance(ids, list) or not isinstance(prompt, list):
            warn_no_token_ids(counts, reply.engine.url)
            counts.whole += 1
            return None
        gen = Generation(choice, prompt, req.weight_version)
        gens.append(gen)
        if choice.get("finish_reason") == "abort":
            aborted.append(gen)
    if not any(g.tokens for g in aborted):
        counts.whole += 1
        return None  # nothing generated: a whole replay costs the same
    budget = body.get("max_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        budget = DEFAULT_MAX_TOKENS  # pinned: never the engine's default for a longer prompt
    counts.answers += 1
    counts.tokens_kept += sum(len(g.tokens) for g in aborted)
    refused = await continue_each(
        aborted, lambda gen, failure: continue_choice(dispatcher, req, body, gen, budget, failure)
    )
    if refused is not None:
        return refused
    ids = not req.asked_ids
    content = joined_answer(doc, gens, ids)
    return Reply(reply.engine, reply.status, reply.headers, content, None, reply.deadline)


async def continue_choice(
    dispatcher: Dispatcher,
    req: Request,
    body: dict[str, Any],
    gen: Generation,
    budget: int,
    failure: list[Reply],
    path: str | None = None,
) -> None:
    """Send ``gen`` again (``body``: the caller's request, ``/v1/completions``
    fields) until it ends other than by an abort pause, to ``path`` (default the
    request's); a non-2xx answer other than a length refusal goes to
    ``failure``. Raises :class:`DispatchAborted` past ``max_continuations``."""
    counts = dispatcher.continued
    while True:
        left = budget - len(gen.tokens)
        if left <= 0:
            gen.end("length")
            return
        count_continuation(dispatcher, req, gen)
        sub = derived(req, continuation_body(body, gen, left), path)
        answer = await send_continuation(dispatcher, req, sub, gen)
        if answer is None:
            continue  # ended by a pause before any token came back: send it again
        if is_length_refusal(answer.status, answer.content):
            gen.end("length")  # prompt + tokens so far no longer fit the model
            return
        if not 200 <= answer.status < 300:
            failure.append(answer)
            return
        try:
            [choice] = orjson.loads(answer.content)["choices"]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            failure.append(answer)
            return
        if not isinstance(choice.get("token_ids"), list):
            warn_no_token_ids(counts, answer.engine.url)
            failure.append(answer)
            return
        if choice.get("finish_reason") == "abort" and sub.replay is False:
            raise req.stamp(sub.aborted())  # a pause without replay ended it
        gen.add(choice, sub.weight_version)
        if choice.get("finish_reason") != "abort" or sub.replay is None:
            return
        counts.tokens_kept += len(choice["token_ids"])
