"""Outcomes of a dispatch: the answer handed back, and the error for a failed attempt."""

from __future__ import annotations

import math

from trioforward.dispatch._engines import Engine
from trioforward.dispatch._policy import parse_retry_after
from trioforward.errors import DispatchTimeout, EngineConnectError, TrioforwardError, UpstreamBroken
from trioforward.http import PoolError, PoolTimeout, StreamContext, StreamResponse
from trioforward.http._errors import Phase

__all__ = ["Answer", "gateway_error", "retry_after"]


class Answer:
    """What ``run`` hands back: the engine's response and, for a stream, its context.

    For a stream with a 2xx/3xx status, ``ctx`` is open and the request still
    holds the engine's capacity: the caller must ``finish`` it.
    """

    __slots__ = ("engine", "status", "headers", "content", "stream", "ctx", "start")

    def __init__(
        self,
        engine: Engine,
        status: int,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        stream: StreamResponse | None,
        ctx: StreamContext | None,
        start: float,
    ) -> None:
        self.engine = engine
        self.status = status
        self.headers = headers
        self.content = content
        self.stream = stream
        self.ctx = ctx
        self.start = start


def gateway_error(
    exc: PoolError, engine: str | None, deadline: float, now: float
) -> TrioforwardError:
    """The gateway error for a failed attempt that will not be retried (DESIGN §4/§5).

    - a deadline (or read timeout) expiry, in any phase: :class:`DispatchTimeout` (504);
    - CONNECT failures: :class:`EngineConnectError` (502);
    - anything else (the engine broke the exchange): :class:`UpstreamBroken` (502).
    """
    phase = exc.phase
    past = deadline < math.inf and now >= deadline
    if isinstance(exc, PoolTimeout) or past:
        if phase is Phase.READ_BODY and not past:
            what = "read_timeout passed with no body bytes"
        else:
            what = "dispatch_timeout passed"
        return DispatchTimeout(
            f"{what} ({phase.value}) on {engine}: {exc}", phase=phase, engine=engine
        )
    if phase is Phase.CONNECT:
        return EngineConnectError(
            f"could not connect to {engine}: {exc}", phase=phase, engine=engine
        )
    return UpstreamBroken(
        f"engine {engine} broke the exchange ({phase.value}): {exc}", phase=phase, engine=engine
    )


def retry_after(headers: list[tuple[bytes, bytes]]) -> float | None:
    """The ``Retry-After`` header of an engine answer, in seconds, or ``None``."""
    for name, value in headers:
        if name == b"retry-after":
            return parse_retry_after(value)
    return None
