"""Outcomes of a dispatch: the answer handed back, and the error for a failed attempt."""

from __future__ import annotations

import math
from collections.abc import Callable

from trioforward import Phase
from trioforward.dispatch.attempts._policy import parse_retry_after
from trioforward.dispatch.engines._engines import Engine
from trioforward.errors import DispatchTimeout, EngineConnectError, TrioforwardError, UpstreamBroken
from trioforward.http import PoolError, PoolTimeout, StreamResponse

__all__ = ["Reply", "gateway_error", "retry_after"]


class Reply:
    """An engine's answer as the attempt loop hands it back.

    ``status``, ``headers`` (lower-case bytes pairs, hop-by-hop not yet removed)
    and ``content`` (the whole body, or ``b""`` for an open stream) are the
    engine's; ``body`` is the open :class:`StreamResponse` of a 2xx/3xx stream
    (closed when ``dispatcher.stream``'s block exits), else ``None``;
    ``deadline`` is the dispatch deadline it ran under (``trio.current_time()``
    scale); ``release()`` ends the dispatch early (a stream continued after an
    abort pause gives its engine capacity back before its block exits).
    """

    __slots__ = ("engine", "status", "headers", "content", "body", "deadline", "release")

    def __init__(
        self,
        engine: Engine,
        status: int,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        body: StreamResponse | None,
        deadline: float,
    ) -> None:
        self.engine = engine
        self.status = status
        self.headers = headers
        self.content = content
        self.body = body
        self.deadline = deadline
        # Ends the dispatch now (body closed, capacity given back): set by the
        # dispatcher on the reply it yields; leaving its block does the same.
        self.release: Callable[[], object] = _nothing


def _nothing() -> None:
    return None


def gateway_error(
    exc: PoolError, engine: str | None, deadline: float, now: float
) -> TrioforwardError:
    """The gateway error for a failed attempt that will not be retried (docs/semantics.md, "Errors and statuses").

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
        # The knob and where it ran out; not the pool's words (they repeat the
        # engine and add its internals): phase and engine are fields of the body.
        return DispatchTimeout(f"{what} ({phase.value}) on {engine}", phase=phase, engine=engine)
    if phase is Phase.CONNECT:
        return EngineConnectError(
            # The pool's own words without its (phase=..., reused=...) suffix: the
            # error body carries phase and attempts as fields of their own.
            f"engine {engine}: {exc.args[0]}", phase=phase, engine=engine
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
