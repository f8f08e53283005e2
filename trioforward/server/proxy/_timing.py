"""``Server-Timing`` on every proxied answer (docs/server.md, "Server-Timing").

W3C Server Timing (https://www.w3.org/TR/server-timing/, the ``server-timing``
header: ``metric;dur=<ms>`` entries, comma-separated) lets a trainer see where
a request's time went without any collector:

- ``queue``: milliseconds in QUEUED (waiting for engine capacity or a pause);
- ``engine``: milliseconds dispatched (capacity held: every attempt, its
  backoffs and adapter loads), up to the answer's head;
- ``admission``: milliseconds it waited at a staleness bound before it started
  (only when it did; docs/operations.md, "Staleness-bounded admission");
- ``gateway``: the rest of the time from the request's head arriving at the
  gateway to the answer's head leaving it (body read, validation, routing,
  encoding): the gateway's own share.

A stream's head is sent when the engine's head arrives, so ``engine`` there is
the time to the engine's first byte; what follows (the body) is not in the
header — HTTP trailers would carry it, but the OpenAI SDK and httpx ignore
them — and is in the access log and the request's trace span instead.
"""

from __future__ import annotations

import trio

__all__ = ["server_timing", "SERVER_TIMING"]

SERVER_TIMING = b"server-timing"


def server_timing(
    arrival: float, queue_time: float, engine_time: float, admission_time: float = 0.0
) -> tuple[bytes, bytes]:
    """The ``(b"server-timing", value)`` header of an answer whose head leaves now.

    ``arrival``: when the request's head reached the gateway (``trio.current_time()``
    clock, s); ``queue_time`` / ``engine_time``: seconds queued / dispatched;
    ``admission_time``: seconds at a staleness bound (an entry only when > 0).
    Durations are written in milliseconds with microsecond resolution.
    """
    total = trio.current_time() - arrival
    gateway = total - queue_time - engine_time - admission_time
    if gateway < 0.0:  # clocks read at different points: never a negative share
        gateway = 0.0
    if admission_time > 0.0:
        return (
            SERVER_TIMING,
            b"admission;dur=%.3f, queue;dur=%.3f, engine;dur=%.3f, gateway;dur=%.3f"
            % (admission_time * 1e3, queue_time * 1e3, engine_time * 1e3, gateway * 1e3),
        )
    return (
        SERVER_TIMING,
        b"queue;dur=%.3f, engine;dur=%.3f, gateway;dur=%.3f"
        % (queue_time * 1e3, engine_time * 1e3, gateway * 1e3),
    )
