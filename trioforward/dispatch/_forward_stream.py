"""``async with client.stream(...) as fs``: a forwarded response read as it arrives."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import trio

from trioforward.dispatch._outcome import Answer, gateway_error
from trioforward.dispatch._request import Request, strip_response_headers
from trioforward.http import PoolError
from trioforward.http._errors import Phase

__all__ = ["ForwardStream"]


class ForwardStream:
    """A streamed engine answer (SSE for ``"stream": true``).

    ``status``/``headers`` (hop-by-hop removed) are the engine's; ``engine`` is
    its URL; ``attempts`` and ``queue_time`` (s) as for ``ForwardResponse``.
    Retries happen only before the headers: once this object exists the answer
    is committed. A failure while reading raises :class:`UpstreamBroken` or
    :class:`DispatchTimeout` with phase ``READ_BODY`` (never retried; the
    connection is closed so the engine aborts). An error status (>= 400) comes
    with its whole body already read; ``aiter_bytes`` yields it.
    """

    __slots__ = (
        "status",
        "headers",
        "engine",
        "attempts",
        "queue_time",
        "retries",
        "_req",
        "_answer",
    )

    def __init__(self, req: Request, answer: Answer) -> None:
        self.status = answer.status
        self.headers = strip_response_headers(answer.headers)
        self.engine = answer.engine.url
        self.attempts = req.attempts
        self.queue_time = req.queue_time
        self.retries = tuple(req.retries) if req.retries else ()
        self._req = req
        self._answer = answer

    @property
    def engine_time(self) -> float:
        """Seconds since dispatch (so far, while the body is still arriving)."""
        return self._req.engine_time + (
            trio.current_time() - self._answer.start if self._answer.ctx else 0.0
        )

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it arrives, in pieces of up to 64 KiB."""
        answer = self._answer
        if answer.stream is None:
            if answer.content:
                yield answer.content
            return
        req = self._req
        try:
            async for chunk in answer.stream.aiter_bytes():
                yield chunk
        except PoolError as exc:
            req.phase = Phase.READ_BODY
            ctx = answer.ctx
            deadline = ctx.deadline if ctx is not None else math.inf
            error = gateway_error(exc, self.engine, deadline, trio.current_time())
            error.attempts = req.attempts
            error.engine = self.engine
            error.queue_time = req.queue_time
            error.engine_time = self.engine_time
            raise error from exc

    async def aread(self) -> bytes:
        """The rest of the body as one ``bytes``."""
        return b"".join([chunk async for chunk in self.aiter_bytes()])
