"""The errors the pool raises, each tagged with the phase of one upstream attempt.

This module imports no trio: classifying a failure into a phase is protocol
logic, not I/O (docs/design.md, "Layers"). The retry layer in ``trioforward.dispatch`` keys
every decision on the three facts each error carries: the phase it failed in,
whether the connection had served a request before (``reused``), and how many
response bytes had arrived (``response_bytes``).
"""

from __future__ import annotations

from trioforward._phase import Phase

__all__ = [
    "Phase",
    "PoolError",
    "ConnectError",
    "ConnectTimeout",
    "RemoteProtocolError",
    "PoolTimeout",
]


class PoolError(Exception):
    """An upstream attempt failed.

    Attributes:
        phase: the :class:`Phase` the attempt was in.
        reused: ``True`` if the connection had completed a request before this
            one (the keep-alive race is only possible then).
        response_bytes: response bytes received before the failure (headers
            included); ``0`` means the engine never answered.
        origin: ``(scheme, host, port)`` of the target.
    """

    def __init__(
        self,
        message: str,
        *,
        phase: Phase,
        reused: bool = False,
        response_bytes: int = 0,
        origin: tuple[str, str, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.phase = phase
        self.reused = reused
        self.response_bytes = response_bytes
        self.origin = origin

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} (phase={self.phase.value}, reused={self.reused}, response_bytes={self.response_bytes})"


class ConnectError(PoolError):
    """TCP connect failed: refused, reset, unreachable, or no address. Phase CONNECT."""


class ConnectTimeout(ConnectError):
    """TCP connect did not finish within ``connect_timeout`` (or the deadline)."""


class RemoteProtocolError(PoolError):
    """The engine closed, reset or broke the HTTP/1.1 exchange (EOF, reset, bad framing)."""


class PoolTimeout(PoolError):
    """A deadline or read timeout expired during ``phase``.

    ``AWAIT_HEADERS``/``READ_BODY`` timeouts are never retried: the connection is
    closed so the engine aborts the work.
    """
