"""Continue a whole answer an abort pause ended, on every route that continues
(docs/operations.md, "Which routes continue"): ``/v1/completions``,
``/v1/chat/completions`` (through the token form: ``/v1/completions`` with the
templated prompt's ids), SGLang ``/generate`` and vLLM ``/inference/v1/generate``
(on their own route).

The route's shape (:func:`~trioforward.dispatch.dialects._routes.shape_for`)
reads the answer into one :class:`~._continue.Generation` per choice; each
aborted one goes through the one continue loop
(:func:`~._continuing.continue_piece`) with :class:`Shaped`, and the shape
joins the segments into the one answer of the route's own shape.

Replayed whole instead (``None``): an answer without token ids (a text prompt
on a token route), a chat request with ``tools``, ``response_format`` or
structured outputs or an answer with ``tool_calls`` or ``reasoning`` (the engine
applies them to the whole message from its first token), a chat request with
no ``max_completion_tokens`` / ``max_tokens`` (vLLM gives chat what the model
length leaves, which a completion continuation cannot know), or nothing
generated yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._events import Events
from trioforward.dispatch.dialects._routes import shape_for
from trioforward.dispatch.rollout._continue import Generation, derived, warn_no_token_ids
from trioforward.dispatch.rollout._continuing import (
    Whole,
    continue_aborted,
    continue_piece,
    loaded,
)

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["continued_answer", "Shaped"]


async def continued_answer(dispatcher: Dispatcher, req: Request, reply: Reply) -> Reply | None:
    """The whole answer of ``req`` (a route of
    :data:`~trioforward.dispatch.dialects._routes.CONTINUED`), whose engine answer
    ``reply`` an abort pause ended, made by continuing each aborted choice; ``None``
    when it cannot be continued (see the module): the caller replays it whole.
    Raises :class:`DispatchAborted` past ``max_continuations`` and the dispatch
    errors of a continuation."""
    counts = dispatcher.continued
    parsed = loaded(req, reply)
    if parsed is None or not isinstance(parsed[0], dict):
        return None
    body, doc = parsed
    shape = shape_for(req.url_path, body)
    pieces = shape.whole(doc)
    if isinstance(pieces, str):
        if pieces == "ids":
            warn_no_token_ids(counts, reply.engine.url)
        counts.whole += 1
        return None
    gens = [Generation(first, prompt, req.weight_version, i) for i, prompt, first in pieces]
    step = Shaped(req, shape)
    return await continue_aborted(
        dispatcher,
        reply,
        [g for g in gens if g.finish == "abort"],
        lambda gen, failure: continue_piece(dispatcher, req, gen, failure, step),
        lambda: shape.joined(doc, gens, not req.asked_ids),
    )


class Shaped(Whole):
    """A choice continued in its route's ``shape`` (:class:`~._continuing.Step`):
    sent on ``shape.path``, read whole with the continuation's own shape."""

    __slots__ = ("req", "shape")
    stream = False

    def __init__(self, req: Request, shape: Events) -> None:
        self.req, self.shape = req, shape

    def left(self, gen: Generation) -> Any:
        budget = self.shape.budget(gen.index)
        return budget - len(gen.tokens) if type(budget) is int else budget

    def request(self, gen: Generation, left: Any) -> Request:
        content = self.shape.continuation(gen, left, self.stream)
        sub = derived(self.req, content, self.shape.path)
        sub.streaming = self.stream
        return sub

    def read(self, answer: Reply, sub: Request) -> Any:
        reader = self.shape.sub_events()
        try:
            choices = reader.choices(orjson.loads(answer.content))
        except orjson.JSONDecodeError as exc:
            raise ValueError("not JSON") from exc
        if len(choices) != 1:
            raise ValueError("not one choice")
        return reader.segment(choices[0], {})

    def add(self, gen: Generation, segment: Any, version: str | None) -> bool:
        gen.add(segment, version)
        return bool(gen.finish == "abort")
