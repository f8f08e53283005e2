"""What one request on a front route leaves behind: its access-log line
(docs/server.md, "Logs"), its metrics and the end of its server span.

:class:`Outcome` is filled in as the request goes (by the ASGI front,
``_asgi.py``, and the route), and written once by :meth:`Outcome.finish`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from trioforward.server.base._state import GatewayState

__all__ = ["CLIENT_CLOSED", "NO_ANSWER", "Outcome", "access_log"]

# nginx's "client closed request": logged and counted when the client hung up.
CLIENT_CLOSED = 499
# nginx's "no response": the server closed the connection before any answer.
NO_ANSWER = 444

access_log = logging.getLogger("trioforward.access")


class Outcome:
    """What one request's access-log line and metrics record (times in seconds).

    ``complete`` is set by the route as it sends the last response message: a
    hang-up after that no longer cancels the work. ``arrival``: when the
    request's head reached the front (``trio.current_time()`` clock), the start
    of its ``Server-Timing`` (:mod:`._timing`).
    """

    __slots__ = (
        "route",
        "arrival",
        "method",
        "status",
        "engine",
        "engines",
        "attempts",
        "queue_time",
        "engine_time",
        "error",
        "complete",
        "version",
        "span",
        "request_id",
        "group",
        "tenant",
        "admission_time",
        "staleness",
    )

    def __init__(self, route: str, method: str = "POST") -> None:
        self.route = route
        self.arrival = trio.current_time()
        self.method = method  # a GET answered 405 is logged as a GET
        self.status = 500
        self.engine: str | None = None
        # Every engine it reached, in order, once it reached more than one (a retry
        # on another engine, a migration: docs/operations.md, "Migration").
        self.engines: list[str] | None = None
        self.attempts = 0
        self.queue_time = 0.0
        self.engine_time: float | None = None
        self.error: str | None = None
        self.complete = False  # the last body message is being sent
        self.version: str | None = None  # X-Weight-Version of the answer
        self.span: Any = None  # its server span when the gateway traces (_tracing.py)
        self.request_id: str | None = None  # X-Request-Id of the answer
        self.group: str | None = None  # X-Rollout-Group of the request
        self.tenant: str | None = None  # its tenant's name (never its key)
        self.admission_time = 0.0  # s at a staleness bound (docs/operations.md)
        self.staleness: int | None = None  # X-Weight-Staleness of the answer

    def cut(self) -> None:
        """The server cancelled the request (the shutdown grace ended): if nothing
        was answered, it is logged and counted as :data:`NO_ANSWER`, not as the
        500 it was never sent."""
        if self.status == 500 and not self.complete:
            self.status, self.error = NO_ANSWER, "closed_at_shutdown"

    def dispatching(self, engine: str, attempts: int, queue_time: float) -> None:
        """An attempt starts (``Client.post``'s ``on_dispatch``)."""
        if self.engine is not None and engine != self.engine:
            if self.engines is None:
                self.engines = [self.engine]
            if engine not in self.engines:
                self.engines.append(engine)
        self.engine, self.attempts, self.queue_time = engine, attempts, queue_time

    def until(self, started: float) -> None:
        """Times of a request whose dispatch did not report them (a client that
        hung up; a stream, whose engine time runs until its end), from
        ``started`` (handed to the dispatch core) to now: all queue time if it
        never reached an engine, else engine time after its queue time."""
        if self.engine_time is not None:
            return
        elapsed = trio.current_time() - started
        if self.engine is None:
            self.queue_time = elapsed
            self.engine_time = 0.0
        else:
            self.engine_time = max(0.0, elapsed - self.queue_time)

    def dispatched(
        self, engine: str | None, attempts: int, queue_time: float, engine_time: float | None
    ) -> None:
        self.engine, self.attempts, self.queue_time, self.engine_time = (
            engine,
            attempts,
            queue_time,
            engine_time,
        )

    def finish(self, state: GatewayState) -> None:
        if self.span is not None:
            state.tracing.end_request(self.span, self)
        dispatched = self.attempts > 0 or self.engine is not None
        if state.metrics is not None:
            state.metrics.observe(
                self.route,
                self.status,
                queue_time=self.queue_time if dispatched else None,
                engine_time=self.engine_time if dispatched else None,
                weight_version=self.version,
                tenant=self.tenant,
                admission_time=self.admission_time,
                staleness=self.staleness,
            )
        if state.settings.access_log and access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "%s %s %d engine=%s attempts=%d queue=%.3fs engine_time=%.3fs id=%s%s%s%s%s%s",
                self.method,
                self.route,
                self.status,
                self.engine or "-",
                self.attempts,
                self.queue_time,
                self.engine_time or 0.0,
                self.request_id or "-",
                f" error={self.error}" if self.error else "",
                f" version={self.version.replace(' ', '')}" if self.version else "",
                f" group={self.group}" if self.group else "",
                f" admission={self.admission_time:.3f}s" if self.admission_time > 0 else "",
                f" engines={','.join(self.engines)}" if self.engines else "",
            )
