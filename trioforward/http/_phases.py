"""Which phase an attempt is in, and which :class:`PoolError` a failure becomes.

Sans-IO (docs/design.md, "Layers"): this module imports no trio. The I/O driver
(:mod:`trioforward.http._connection`, :mod:`trioforward.http._pool`) moves an
:class:`Attempt` through the phases and, when something goes wrong, asks it for
the error to raise. Keeping the mapping here means the retry layer's contract
(``phase``, ``reused``, ``response_bytes``) is decided in one place.
"""

from __future__ import annotations

import os
from typing import Protocol

from trioforward._h11 import h11
from trioforward.http._errors import (
    ConnectError,
    ConnectTimeout,
    Phase,
    PoolError,
    PoolTimeout,
    RemoteProtocolError,
)

__all__ = ["Attempt", "PhaseSink"]

_CONNECT = Phase.CONNECT


class PhaseSink(Protocol):
    """Where a caller wants to learn the phase an attempt reached when it was
    cancelled (the dispatch core passes its per-request record): anything with a
    writable ``phase``. A :class:`PoolError` carries its own ``.phase`` instead."""

    phase: Phase


class Attempt:
    """One request's progress through CONNECT → SEND → AWAIT_HEADERS → READ_BODY.

    The hot path (:meth:`ConnectionPool.request`) keeps these facts in local
    variables and builds an ``Attempt`` only to raise: an object that lives
    across every await of thousands of in-flight requests is garbage-collector
    work (docs/performance.md). Mutable on purpose: the driver assigns ``phase`` as it goes (``SEND`` is set
    *before* the first request byte is written) and adds every received byte to
    ``response_bytes``. ``origin`` is ``(scheme, host, port)``.
    """

    __slots__ = ("phase", "reused", "response_bytes", "origin")

    def __init__(
        self,
        origin: tuple[str, str, int],
        phase: Phase = _CONNECT,
        reused: bool = False,
        response_bytes: int = 0,
    ) -> None:
        self.phase = phase
        self.reused = reused
        self.response_bytes = response_bytes
        self.origin = origin

    def _error(self, cls: type[PoolError], message: str) -> PoolError:
        return cls(
            message,
            phase=self.phase,
            reused=self.reused,
            response_bytes=self.response_bytes,
            origin=self.origin,
        )

    def _where(self) -> str:
        _, host, port = self.origin
        return f"{host}:{port}"

    def failure(self, exc: BaseException) -> PoolError:
        """The error for a transport or protocol failure ``exc`` in the current phase.

        - CONNECT: :class:`ConnectError` (refused, reset, unreachable, no address).
        - later phases: :class:`RemoteProtocolError` (reset, broken pipe, EOF,
          malformed HTTP/1.1 from the engine).
        """
        if self.phase is _CONNECT:
            return self._error(ConnectError, f"connect to {self._where()} failed: {os_reason(exc)}")
        if isinstance(exc, h11.RemoteProtocolError):
            if "ConnectionClosed" in str(exc):
                # h11's words for an EOF where a response (or the rest of one) was due.
                return self.closed()
            what = f"engine broke HTTP/1.1: {exc}"
        else:
            what = f"connection failed: {exc!r}"
        return self._error(RemoteProtocolError, f"{self._where()}: {what}")

    def closed(self) -> PoolError:
        """The engine closed the connection (EOF) before the response was complete."""
        return self._error(
            RemoteProtocolError, f"{self._where()}: engine closed the connection mid-exchange"
        )

    def timeout(self, what: str = "deadline") -> PoolError:
        """A deadline/timeout expired: :class:`ConnectTimeout` in CONNECT, else :class:`PoolTimeout`."""
        cls = ConnectTimeout if self.phase is _CONNECT else PoolTimeout
        return self._error(cls, f"{self._where()}: {what} expired")


def os_reason(exc: BaseException) -> str:
    """The operating system's words for a failed connect, e.g. ``"Connection refused"``.

    ``trio.open_tcp_stream`` raises ``OSError("all attempts to connect to H:P failed")``
    whose ``__cause__`` groups one error per address tried; the errno text of those is
    what an operator needs, once each. Anything else falls back to ``repr(exc)``.
    """
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)  # trio's strerror repeats the address
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        reasons = dict.fromkeys(os_reason(sub) for sub in cause.exceptions)
        return "; ".join(reasons)
    if cause is not None:
        return os_reason(cause)
    return repr(exc)
