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

from trioforward.codec import UNVERSIONED, CodecError, Completion, span_version
from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects import _dialect_completions
from trioforward.dispatch.rollout._continue import derived
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


class _Choice:
    __slots__ = ("index", "prompt", "tokens", "logprobs", "spans", "finish", "stop", "continuations", "text")

    def __init__(self, choice: Any, prompt: list[int], version: str | None) -> None:
        self.index = choice.index
        self.prompt = prompt
        self.tokens: list[int] = []
        self.logprobs: list[float | None] | None = None if choice.logprobs is None else []
        self.spans: list[dict[str, Any]] = []
        self.finish: Any = None
        self.stop: Any = None
        self.continuations = 0
        self.text = ""
        self.add(choice, version)

    def add(self, choice: Any, version: str | None) -> None:
        ids = [int(t) for t in choice.tokens]
        version = span_version(version)
        if ids:
            start = len(self.tokens)
            if self.spans and self.spans[-1]["version"] == version:
                self.spans[-1]["end"] = start + len(ids)
            else:
                self.spans.append({"version": version, "start": start, "end": start + len(ids)})
        self.tokens.extend(ids)
        if self.logprobs is not None:
            lps = choice.logprobs if choice.logprobs is not None else [math.nan] * len(ids)
            self.logprobs.extend(None if math.isnan(v) else float(v) for v in lps)
        self.finish, self.stop = choice.finish_reason, choice.stop_reason
        self.text += choice.text or ""

    def end(self, finish: str) -> None:
        self.finish, self.stop = finish, None

    def rendered(self) -> dict[str, Any]:
        lp = None if self.logprobs is None else {"token_logprobs": self.logprobs}
        return {
            "index": self.index,
            "text": self.text,
            "logprobs": lp,
            "finish_reason": self.finish,
            "stop_reason": self.stop,
            "token_ids": self.tokens,
            "prompt_token_ids": self.prompt,
            "weight_versions": self.spans or [{"version": UNVERSIONED, "start": 0, "end": 0}],
        }


async def continued_tokens(
    dispatcher: Dispatcher, req: Request, reply: Reply, completion: Completion
) -> Reply | None:
    """The joined answer of token-level ``req`` (its abort answer ``completion``),
    or ``None`` when nothing was generated yet (replay it whole)."""
    render: Any = req.render
    base = render.request
    choices = [_Choice(c, list(base.prompt), req.weight_version) for c in completion.choices]

    def joined() -> bytes:
        use = dict(completion.usage)
        generated = sum(len(c.tokens) for c in choices)
        prompt = int(use.get("prompt_tokens") or len(base.prompt))
        use.update(prompt_tokens=prompt, completion_tokens=generated, total_tokens=prompt + generated)
        render.dialect = _dialect_completions  # the joined answer is in the completions shape
        return orjson.dumps(
            {
                "id": completion.id,
                "object": "text_completion",
                "model": completion.model or base.model,
                "choices": [c.rendered() for c in choices],
                "usage": use,
            }
        )

    return await continue_aborted(
        dispatcher,
        reply,
        [c for c in choices if c.finish == "abort"],
        lambda choice, failure: _continue(dispatcher, req, choice, failure),
        joined,
    )


async def _continue(dispatcher: Dispatcher, req: Request, choice: _Choice, failure: list[Reply]) -> None:
    await continue_piece(dispatcher, req, choice, failure, _Tokens(req))


class _Tokens(Whole):
    """A token-level choice continued through the dialect seam (:class:`~._continuing.Step`)."""

    __slots__ = ("req", "base")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.base = cast(Any, req.render).request

    def left(self, choice: _Choice) -> int:
        return int(self.base.max_tokens) - len(choice.tokens)

    def request(self, choice: _Choice, left: int) -> Request:
        from trioforward.dispatch.dialects._complete import Rendering

        token_req = dataclasses.replace(
            self.base, prompt=choice.prompt + choice.tokens, max_tokens=left, n=1,
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
        return got

    def add(self, choice: _Choice, got: Any, version: str | None) -> bool:
        choice.add(got, version)
        return bool(got.finish_reason == "abort")
