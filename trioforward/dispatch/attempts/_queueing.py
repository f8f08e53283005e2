"""QUEUED: routing a request and waiting for its engine's capacity, and work
conservation under prefix routing (docs/dispatch.md, "Engines, capacity and routing";
docs/dispatch.md, "Prefix routing").

The attempt loop (``Dispatcher._dispatch`` in ``_dispatch.py``) calls
:func:`acquire` each time a request queues (first, and again after moving to
another engine) and :func:`conserve` each time it gives an engine's capacity back.
A drain (``_drain.py``) ends the waits of :func:`acquire` with
:class:`ShuttingDown`.
"""

from __future__ import annotations

import trio

from trioforward.dispatch.attempts._drain import Drain
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.engines._engines import Engine, Registry
from trioforward.dispatch.engines._routing import Router
from trioforward.errors import NoEngineAvailable, QueueTimeout

__all__ = ["acquire", "conserve"]


async def acquire(
    req: Request,
    avoid: Engine | None,
    queue_deadline: float,
    now: float,
    *,
    registry: Registry,
    router: Router,
    unhealthy_timeout: float | None,
    drain: Drain,
) -> tuple[Engine, float]:
    """Route ``req`` and wait for that engine's capacity.

    Returns the engine (token held) and the time it was acquired (``now`` if
    there was no wait: the clock is read only when time can have passed).

    Raises :class:`NoEngineAvailable` (none registered, or none eligible when
    ``queue_deadline`` passes), :class:`QueueTimeout`, or :class:`ShuttingDown`
    when ``drain`` ends the wait (module ``_drain``: at its cutoff, or at once
    when no engine can serve the request).
    """
    woken = False
    waited = False
    unhealthy_since: float | None = None
    while True:
        if drain.over():
            raise drain.refusal()
        engines = registry.engines
        if req.only is not None:
            engines = [e for e in engines if req.only(e)]
        if req.accepts is not None and engines:
            accepted = [e for e in engines if req.accepts(e)]
            if not any(e.eligible for e in accepted):
                if woken:
                    registry.wake()  # not its turn after all: the next parked one's
                    woken = False
                waited = True
                await _wait_for_version(req, queue_deadline, registry, drain)
                continue
            engines = accepted
        engine = router.pick(engines, session=req.session, avoid=avoid, prefix=req.prefix)
        if engine is None:
            if not registry.engines:
                raise NoEngineAvailable("no engine is registered")
            deadline, why = queue_deadline, "queue_timeout"
            if unhealthy_timeout is not None and not registry.any_healthy_paused():
                # Nothing to wait for but a failed engine coming back: unlike a
                # capacity queue or a weight-update pause this wait has no
                # progress guarantee, so it gets its own bound.
                if unhealthy_since is None:
                    unhealthy_since = trio.current_time()
                if unhealthy_since + unhealthy_timeout < deadline:
                    deadline, why = unhealthy_since + unhealthy_timeout, "unhealthy_timeout"
            message = f"no healthy engine ({len(registry.engines)} registered) before {why} passed"
            if trio.current_time() >= deadline:
                raise NoEngineAvailable(message)
            if drain.draining and drain.hopeless():
                if woken:
                    registry.wake()  # the next parked request meets the same answer
                raise drain.refusal()
            waited = True
            with trio.CancelScope(deadline=min(deadline, drain.cutoff)) as wait:
                with drain.bounding(wait, for_engine=True):
                    await registry.wait_eligible()
                woken = True
                continue
            if drain.draining:
                continue  # the drain may have ended the wait: the checks above decide
            raise NoEngineAvailable(message)
        if woken:
            registry.wake()  # hand the wake-up on: parked requests leave in FIFO order
            woken = False
        queue = engine.queue
        if not queue.take_nowait(req.tenant):
            waited = True
            if trio.current_time() >= queue_deadline:
                raise QueueTimeout(
                    "engine capacity not available before queue_timeout", engine=engine.url
                ) from None
            req.rerouted = False
            scope = req.queue_scope = trio.CancelScope(deadline=min(queue_deadline, drain.cutoff))
            got = None
            try:
                with scope, drain.bounding(scope, for_engine=False):
                    got = await queue.take(req)
            finally:
                req.queue_scope = None
            if got is None:
                if req.rerouted:
                    continue  # paused/ejected/removed while we queued: route again
                if drain.over():
                    raise drain.refusal() from None
                raise QueueTimeout(
                    "engine capacity not available before queue_timeout", engine=engine.url
                ) from None
            if got is not queue:
                # Work conservation handed it a free slot of another engine (conserve).
                engine = got.owner
                if router.prefix is not None and req.prefix is not None:
                    router.prefix.moved(req.prefix, engine)  # its next turn follows it
        if engine.eligible and (req.accepts is None or req.accepts(engine)):
            return engine, (trio.current_time() if waited else now)
        # Became ineligible between the token hand-off and now.
        engine.queue.give_back(req.tenant)
        avoid = None


async def _wait_for_version(
    req: Request, queue_deadline: float, registry: Registry, drain: Drain
) -> None:
    """Wait until engines or versions change: no eligible engine runs weights
    ``req``'s policy accepts (docs/operations.md, "Which weights a request
    accepts"). Bounded by ``queue_timeout`` like any QUEUED wait, never by
    ``unhealthy_timeout``: a resume is on its way, as behind a pause."""
    message = (
        "no engine ran weights the request's X-Weight-Policy accepts before queue_timeout passed"
    )
    if drain.over():
        raise drain.refusal()
    if trio.current_time() >= queue_deadline:
        raise NoEngineAvailable(message)
    with trio.CancelScope(deadline=min(queue_deadline, drain.cutoff)) as wait:
        with drain.bounding(wait, for_engine=False):
            await registry.wait_changed()
        return
    if drain.over():
        raise drain.refusal()
    raise NoEngineAvailable(message)


def conserve(router: Router, registry: Registry, engine: Engine) -> None:
    """Work conservation under ``routing = "prefix"`` (docs/dispatch.md): a slot
    of ``engine`` that no request queued there takes goes to the request the
    engine with the longest queue would serve next (its fair order: the next
    tenant's oldest request), if ``engine`` is within the load bound. That
    request wakes holding the slot (``FairQueue.hand_over``). Requests with a
    session key stay where their session is."""
    prefix = router.prefix
    if prefix is None or not engine.eligible or engine.queue.available_tokens < 1:
        return
    engines = registry.engines
    donor = max(engines, key=lambda e: len(e.queue))
    if donor is engine or not len(donor.queue) or engine.outstanding >= prefix.room(engines):
        return
    donor.queue.hand_over(
        engine.queue,
        lambda req: (req.only is None or req.only(engine))
        and (req.accepts is None or req.accepts(engine)),
    )
