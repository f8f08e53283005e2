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
    joined_answer,
    warn_no_token_ids,
)
from trioforward.dispatch.rollout._continuing import (
    Whole,
    continue_aborted,
    continue_piece,
    loaded,
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
    body, doc = loaded(req, reply) or (None, None)
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
    budget = body.get("max_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        budget = DEFAULT_MAX_TOKENS  # pinned: never the engine's default for a longer prompt
    return await continue_aborted(
        dispatcher,
        reply,
        aborted,
        lambda gen, failure: continue_choice(dispatcher, req, body, gen, budget, failure),
        lambda: joined_answer(doc, gens, not req.asked_ids),
    )


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
    await continue_piece(dispatcher, req, gen, failure, _Completions(req, body, budget, path))


class _Completions(Whole):
    """A ``/v1/completions`` choice continued (:class:`~._continuing.Step`)."""

    __slots__ = ("req", "body", "budget", "path")

    def __init__(self, req: Request, body: dict[str, Any], budget: int, path: str | None) -> None:
        self.req, self.body, self.budget, self.path = req, body, budget, path

    def left(self, gen: Generation) -> int:
        return self.budget - len(gen.tokens)

    def request(self, gen: Generation, left: int) -> Request:
        return derived(self.req, continuation_body(self.body, gen, left), self.path)

    def read(self, answer: Reply, sub: Request) -> dict[str, Any] | None:
        try:
            [choice] = orjson.loads(answer.content)["choices"]
        except (KeyError, TypeError) as exc:
            raise ValueError("not a one-choice completion") from exc
        return choice if isinstance(choice.get("token_ids"), list) else None

    def add(self, gen: Generation, choice: dict[str, Any], version: str | None) -> bool:
        gen.add(choice, version)
        return choice.get("finish_reason") == "abort"
