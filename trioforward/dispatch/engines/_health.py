"""Health probes (docs/design.md, "Engines, capacity and routing"): ``GET /health`` every ``health_interval``.

An SGLang engine is probed on ``GET /ready`` (SGLang 0.5.20+: 200 when started,
healthy and not paused, else 503; ``/health`` submits a one-token generation
that waits while the engine is paused and answers 503 after 20 s,
``srt/entrypoints/http_server.py``); one without ``/ready`` (404, older
releases) on ``/health``. A failed probe of an SGLang engine the gateway paused
is not counted: a paused SGLang is not ready, by design, and ejecting it would
take every engine of a weight update out of the fleet.

One task per engine, in the client's nursery, on a pool of its own (unlimited
connections) so that a saturated engine, whose forwarding connection slots are
all busy, is not mistaken for a dead one. ``health_failures`` failures in a row
eject the engine (no new dispatch; connect failures during dispatch count too);
``health_successes`` successes in a row re-admit it.
"""

from __future__ import annotations

import trio

from trioforward.dispatch.engines._engines import Engine, Registry
from trioforward.http import ConnectionPool, PoolError

__all__ = ["probe_once", "health_loop"]


async def probe_once(pool: ConnectionPool, engine: Engine, probe_timeout: float) -> bool:
    """One probe: True if ``GET /health`` (SGLang: ``/ready``) answered 2xx within
    ``probe_timeout`` seconds."""
    path = engine.health_path
    try:
        response = await pool.request(
            "GET", engine.url + path, deadline=trio.current_time() + probe_timeout
        )
    except PoolError:
        return False
    if response.status == 404 and path != "/health":
        engine.health_path = "/health"  # an SGLang before 0.5.20: no /ready
        return await probe_once(pool, engine, probe_timeout)
    return 200 <= response.status < 300


async def health_loop(
    registry: Registry,
    pool: ConnectionPool,
    engine: Engine,
    *,
    interval: float,
    probe_timeout: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Probe ``engine`` until it is removed (its ``health_scope`` is cancelled).

    The first probe runs one ``interval`` after registration: an engine is
    trusted when added, and connect failures eject it sooner if it is down.
    """
    with trio.CancelScope() as scope:
        engine.health_scope = scope
        task_status.started()
        while not engine.removed:
            await trio.sleep(interval)
            ok = await probe_once(pool, engine, probe_timeout)
            if engine.removed:
                break
            if ok:
                registry.record_success(engine, probe=True)
            elif not (engine.paused and engine.kind == "sglang"):
                registry.record_failure(engine)
