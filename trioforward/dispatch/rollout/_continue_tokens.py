"""Continue a token-level request (``client.complete()``, Tinker samples) through
the dialect seam (docs/dispatch.md, "Engine dialects"; docs/operations.md,
"Continue after an abort pause").

The abort answer is read with the dialect of the engine that gave it; each
aborted choice is sent again as a new :class:`TokenRequest` (prompt + tokens so
far, ``n: 1``, the budget left), rendered for whichever engine takes it; the
joined answer is handed back as a ``/v1/completions`` body with per-choice
``weight_versions``, and the request's rendering then parses it with that dialect.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, cast

import orjson

from trioforward.codec import CodecError, Completion
from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects import _dialect_completions
from trioforward.dispatch.dialects._complete import Rendering
from trioforward.dispatch.dialects._events import usage
from trioforward.dispatch.rollout._continue import Generation, derived
from trioforward.dispatch.rollout._continuing import (
    Whole,
    continue_aborted,
    continue_piece,
)

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["aborted_tokens", "continued_tokens"]


def aborted_tokens(req: Request, reply: Reply) -> Completion | None:
    """The answer of a token-level request, read by its dialect, if an engine
    pause ended some choice of it (``finish_reason`` "abort"), else ``None``."""
    render: Any = req.render
    if not 200 <= reply.status < 300 or not hasattr(render, "parse"):
        return None
    try:
        completion: Completion = render.parse(reply.content, req.weight_version)
    except CodecError:
        return None
    if any(c.finish_reason == "abort" for c in completion.choices):
        return completion
    return None


def _segment(choice: Any, first: bool = False) -> dict[str, Any]:
    """A codec choice as a segment (``logprobs`` of the ``/v1/completions`` shape; a
    continuation without them fills its places with ``None``)."""
    ids = [int(t) for t in choice.tokens]
    lps = None if choice.logprobs is None else [None if math.isnan(v) else float(v) for v in choice.logprobs]
    block = None if first and lps is None else {"token_logprobs": [None] * len(ids) if lps is None else lps}
    return {
        "index": choice.index, "text": choice.text or "", "logprobs": block, "token_ids": ids,
        "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason,
    }  # fmt: skip


async def continued_tokens(
    dispatcher: Dispatcher, req: Request, reply: Reply, completion: Completion
) -> Reply | None:
    """The joined answer of token-level ``req`` (its abort answer ``completion``),
    or ``None`` when nothing was generated yet (replay it whole)."""
    render: Any = req.render
    base = render.request
    prompt, version = list(base.prompt), req.weight_version
    gens = [
        Generation({**_segment(c, True), "prompt_token_ids": prompt}, prompt, version, c.index)
        for c in completion.choices
    ]

    def joined() -> bytes:
        render.dialect = _dialect_completions  # the joined answer is in the completions shape
        return orjson.dumps(
            {
                "id": completion.id,
                "object": "text_completion",
                "model": completion.model or base.model,
                "choices": [g.rendered(g.index, True) for g in gens],
                "usage": usage({"usage": completion.usage}, gens, len(base.prompt)),
            }
        )

    step = _Tokens(req)
    return await continue_aborted(
        dispatcher,
        reply,
        [g for g in gens if g.finish == "abort"],
        lambda gen, failure: continue_piece(dispatcher, req, gen, failure, step),
        joined,
    )


class _Tokens(Whole):
    """A token-level choice continued through the dialect seam (:class:`~._continuing.Step`)."""

    __slots__ = ("req", "base")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.base = cast(Any, req.render).request

    def left(self, gen: Generation) -> int:
        return int(self.base.max_tokens) - len(gen.tokens)

    def request(self, gen: Generation, left: int) -> Request:
        token_req = dataclasses.replace(
            self.base, prompt=gen.prompt + gen.tokens, max_tokens=left, n=1,
            request_id=None, prompt_logprobs=False, extra=dict(self.base.extra),
        )  # fmt: skip
        content = _dialect_completions.render(token_req, "")[1]
        sub = derived(self.req, content)
        sub.render = Rendering(token_req, content)
        return sub

    def read(self, answer: Reply, sub: Request) -> Any:
        try:
            [got] = cast(Any, sub.render).parse(answer.content, sub.weight_version).choices
        except (CodecError, ValueError):
            return None
        return _segment(got)

    def add(self, gen: Generation, segment: Any, version: str | None) -> bool:
        gen.add(segment, version)
        return bool(gen.finish == "abort")
