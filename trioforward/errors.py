"""Errors the dispatch core raises to callers of :func:`trioforward.open_client`.

Every error carries:

- ``.phase``: the :class:`~trioforward.http.Phase` the request was in when it
  ended: ``QUEUED`` while waiting for capacity or an engine, else the phase its
  last attempt had reached, however it ended (docs/semantics.md, "Which phase
  an error names");
- ``.attempts``: how many upstream attempts were made (``0`` = none);
- ``.engine``: the base URL of the engine of the last attempt, or ``None``.

The gateway maps them to HTTP statuses (docs/server.md, "Errors"): :attr:`TrioforwardError.status`.
"""

from __future__ import annotations

from trioforward import Phase

__all__ = [
    "Phase",
    "TrioforwardError",
    "EngineConnectError",
    "EngineRejected",
    "DispatchTimeout",
    "QueueTimeout",
    "QueueFull",
    "TenantQueueFull",
    "UpstreamBroken",
    "NoEngineAvailable",
    "AdapterLoadError",
    "DispatchAborted",
    "ContinuationLimit",
    "ShuttingDown",
    "EngineControlError",
    "PauseOvertaken",
]


class TrioforwardError(Exception):
    """Base of every dispatch error. ``status`` is the HTTP status the gateway answers."""

    status: int = 502
    code: str = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        phase: Phase = Phase.QUEUED,
        attempts: int = 0,
        engine: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.phase = phase
        self.attempts = attempts
        self.engine = engine
        # Filled in by the dispatch core: seconds spent QUEUED, and from dispatch
        # (capacity acquired) to the failure.
        self.queue_time = 0.0
        self.engine_time = 0.0
        # Seconds a client should wait before retrying (the ``Retry-After`` the
        # gateway sends with its own 429/503), or None.
        self.retry_after: int | None = None
        # The request's id (docs/server.md, "Request ids and rollout groups"), or
        # None for an error raised before the request had one.
        self.request_id: str | None = None

    def to_json(self) -> dict[str, object]:
        """The OpenAI-style error body (docs/server.md, "Errors")."""
        return {
            "error": {
                "message": self.message,
                "type": type(self).__name__,
                "code": self.code,
                "phase": self.phase.value,
                "attempts": self.attempts,
                "engine": self.engine,
            }
        }


class EngineConnectError(TrioforwardError):
    """No TCP connection could be opened (after the connect retries). 502."""

    code = "engine_connect_failed"


class EngineRejected(TrioforwardError):
    """The engine answered with an error status; ``.status`` and ``.body`` are the engine's own.

    Raised only by APIs that decode results (``client.complete``); ``client.post``
    returns the engine's response instead.
    """

    code = "engine_rejected"

    def __init__(self, message: str, *, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.status = status
        self.body = body
        self.headers = headers or []


class DispatchTimeout(TrioforwardError):
    """``dispatch_timeout`` (or ``read_timeout``) passed after capacity was acquired. 504."""

    status = 504
    code = "dispatch_timeout"


class QueueTimeout(TrioforwardError):
    """``queue_timeout`` passed while waiting for capacity or a healthy engine. 503."""

    status = 503
    code = "queue_timeout"


class QueueFull(TrioforwardError):
    """More than ``max_outstanding`` requests outstanding. 429."""

    status = 429
    code = "queue_full"


class TenantQueueFull(QueueFull):
    """The request's tenant has its ``max_outstanding`` requests outstanding (its
    row of the tenant table). 429, before the request holds anything; ``.tenant``
    is the tenant's name."""

    code = "tenant_queue_full"

    def __init__(self, message: str, *, tenant: str, outstanding: int = 0) -> None:
        super().__init__(message)
        self.tenant = tenant
        self.outstanding = outstanding  # the tenant's, when it was refused


class UpstreamBroken(TrioforwardError):
    """The engine broke the exchange after it may have started work (fresh connection
    after sending, or while reading the body). Never retried. 502."""

    code = "upstream_broken"


class NoEngineAvailable(TrioforwardError):
    """No engine is registered, or none is healthy and ``queue_timeout`` is 0. 503."""

    status = 503
    code = "no_engine_available"


class AdapterLoadError(TrioforwardError):
    """A LoRA adapter could not be loaded on the engine; the message names the adapter. 502
    (or the engine's 4xx when the engine refused the load)."""

    code = "adapter_load_failed"

    def __init__(self, message: str, *, adapter: str, status: int = 502, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.adapter = adapter
        self.status = status


class DispatchAborted(TrioforwardError):
    """The request was aborted by ``pause(mode="abort")`` or an engine removal. 503."""

    status = 503
    code = "aborted"


class ContinuationLimit(DispatchAborted):
    """An abort pause with ``replay="continue"`` ended a generation that had been
    continued ``max_continuations`` times already: it is not continued again.
    503, ``phase`` ``queued`` (the next continuation was never dispatched);
    a :class:`DispatchAborted`, so callers catching that still catch it
    (docs/operations.md, "Continue after an abort pause")."""

    code = "continuation_limit"


class ShuttingDown(TrioforwardError):
    """The gateway is draining (or the client was closed) and the request was never
    dispatched: it was still QUEUED when the drain's cutoff came, waited for an
    engine while none could serve it during the drain, or arrived after the
    cutoff. No engine ran it, so it is safe to send again (to another gateway, or
    after the restart). 503 with ``Retry-After`` (docs/server.md, "Shutdown";
    docs/embedding.md, "Closing the client")."""

    status = 503
    code = "shutting_down"


class EngineControlError(TrioforwardError):
    """An engine refused or failed a weight-update call (pause, resume, weight
    version: docs/operations.md); ``.engine`` names it. 502. ``.answered`` is
    False when the engine's answer never came (timeout, broken connection): the
    call may have taken effect on the engine."""

    code = "engine_control_failed"
    answered: bool = True


class PauseOvertaken(EngineControlError):
    """A resume arrived while this pause was still in progress (draining, or
    waiting for an engine's answer): the resume won, the engines the pause had
    reached are resumed with it, and the pause ends here. 409
    (docs/operations.md, "Overlapping control calls")."""

    status = 409
    code = "pause_overtaken"
