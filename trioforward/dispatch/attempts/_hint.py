"""``Retry-After`` for the gateway's own rejections: when to come back, from what the
dispatch core knows (docs/server.md, "Headers passed on").

RFC 9110 §10.2.3: ``Retry-After`` on a 429 or 503 tells the client how long to
wait; the ``openai`` SDK and the ``tinker`` SDK's backoff read it. A whole
number of seconds, at least 1 (a 0 invites an immediate retry storm), at most
:data:`LIMIT`.
"""

from __future__ import annotations

import math

import trio

from trioforward.dispatch.engines._engines import Registry
from trioforward.errors import (
    DispatchAborted,
    NoEngineAvailable,
    QueueFull,
    QueueTimeout,
    ShuttingDown,
    TrioforwardError,
)

__all__ = ["retry_after_hint", "LIMIT"]

LIMIT = 600  # s: beyond this a client had better look at /health than sleep


def retry_after_hint(
    error: TrioforwardError,
    registry: Registry,
    *,
    outstanding: int,
    engine_time: float,
    health_interval: float,
    health_successes: int,
) -> int | None:
    """Seconds a client should wait before retrying after ``error``; ``None`` if the
    error is not one of the gateway's 429/503 rejections.

    - queue full (429) / ``queue_timeout`` (503): the time for the requests ahead
      to drain — ``engine_time`` (recent mean seconds per dispatch) times the
      ``outstanding`` requests per unit of eligible engine capacity (at least one
      request's worth);
    - no engine / aborted by a pause: how long the pause has lasted so far (a
      weight update that took X s is about X s from done); no healthy engine:
      the health probes' time to re-admit one (``health_interval`` ×
      ``health_successes``); no engine registered or an engine removed: 1 s;
    - shutting down (a queued request the drain ended): 1 s — the request
      should go to another gateway, or to this one once it is back.

    O(engines); called only on the error path.
    """
    if isinstance(error, (QueueFull, QueueTimeout)):
        capacity = 0.0
        for engine in registry.engines:
            if engine.eligible:
                capacity += engine.capacity if engine.capacity > 0 else math.inf
        per_slot = outstanding / capacity if capacity > 0 else 1.0
        return _seconds(engine_time * max(1.0, per_slot))
    if isinstance(error, ShuttingDown):
        return 1
    if not isinstance(error, (NoEngineAvailable, DispatchAborted)):
        return None
    engines = registry.engines
    paused = [e.paused_since for e in engines if e.paused and e.paused_since is not None]
    if paused and (isinstance(error, NoEngineAvailable) or "paused" in error.message):
        return _seconds(trio.current_time() - min(paused))
    if isinstance(error, NoEngineAvailable) and engines and not any(e.healthy for e in engines):
        return _seconds(health_interval * max(1, health_successes))
    return 1


def _seconds(estimate: float) -> int:
    if not estimate > 0:  # also NaN
        return 1
    return max(1, min(LIMIT, math.ceil(estimate)))
