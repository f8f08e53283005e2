"""Where, when and whether again: one request from QUEUED to its answer (docs/design.md, "Retry rules").

``Dispatcher.request`` (whole answer) and ``async with Dispatcher.stream(...)``
(body read inside the block) share one attempt loop, ``_dispatch``. It routes a
:class:`Request`, waits for the engine's capacity
(QUEUED: bounded only by ``queue_timeout``), computes the dispatch deadline once
(``dispatch_timeout`` from capacity acquired) and makes attempts under it
(routing and the capacity wait itself live in ``_queueing.py``; the attempts
on one engine in ``_attempts.py``). After
every attempt it asks ``_policy`` what the outcome means and carries the
decision out: return, raise the gateway error, or retry — at once on a fresh
connection, after a backoff, after loading an adapter, or on another engine.
Moving to another engine gives the capacity back and queues again; that queue
time is not charged to the dispatch budget (the remaining budget is carried over).

Lifetimes are syntactic: ``outstanding`` is counted up and down in that one
loop, an engine's capacity is held inside one ``try`` per engine and given back
in its ``finally``, and a streamed body's connection is closed (or parked) when
the ``stream`` block exits — nowhere else.

Cancellation: the caller's cancellation propagates at once (the pool closes the
upstream connection, so the engine aborts); it is never retried.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from functools import partial

import trio

from trioforward import Settings
from trioforward.dispatch.attempts._attempts import AttemptLoop
from trioforward.dispatch.attempts._budget import RetryBudget
from trioforward.dispatch.attempts._counts import ContinueCounts
from trioforward.dispatch.attempts._drain import Drain
from trioforward.dispatch.attempts._hint import retry_after_hint
from trioforward.dispatch.attempts._identity import IdMaker
from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._policy import RetryPolicy
from trioforward.dispatch.attempts._queueing import acquire, conserve
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.engines._adapters import AdapterLoader
from trioforward.dispatch.engines._engines import Engine, Registry
from trioforward.dispatch.engines._routing import Router
from trioforward.dispatch.engines._tenants import refusal
from trioforward.errors import TenantQueueFull, TrioforwardError
from trioforward.http import ConnectionPool

__all__ = ["Dispatcher", "Reply"]

_inf = math.inf


class Dispatcher(AttemptLoop):
    """The shared dispatch state of one client."""

    def __init__(
        self, settings: Settings, registry: Registry, pool: ConnectionPool, loader: AdapterLoader
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.pool = pool
        self.loader = loader
        self.router = Router(
            settings.routing,
            prefix_load_factor=settings.prefix_load_factor,
            prefix_table_size=settings.prefix_table_size,
            affinity_floor=settings.affinity_floor,
            session_table_size=settings.session_affinity_size,
            session_ttl=settings.session_affinity_ttl,
        )
        self.policy = RetryPolicy(
            connect_retries=settings.connect_retries,
            rejection_retries=settings.rejection_retries,
            backoff_initial=settings.backoff_initial,
            backoff_max=settings.backoff_max,
            adapter_max_attempts=settings.adapter_max_attempts,
            adapter_backoff_max=settings.adapter_backoff_max,
        )
        # The jitter source (tests may replace it to pin the backoff).
        self.rand: Callable[[], float] = random.random
        self.budget = RetryBudget(settings.retry_budget_ratio, settings.retry_budget_min)
        self.dispatch_timeout = (
            _inf if settings.dispatch_timeout is None else settings.dispatch_timeout
        )
        self.queue_timeout = settings.queue_timeout
        self.unhealthy_timeout = settings.unhealthy_timeout
        self.read_timeout = settings.read_timeout
        self.max_outstanding = settings.max_outstanding
        self.requests_total = 0
        self.outstanding = 0
        self.in_flight = 0
        self.queued = 0
        self.retries: Counter[tuple[str, str]] = Counter()
        self.responses: Counter[tuple[str, int]] = Counter()
        # Recorded by resume(weight_version=...); stamped on each request at dispatch.
        self.weight_version: str | None = None
        self.continued = ContinueCounts()  # replay="continue" (dispatch/rollout/_continue.py)
        # Moving mean (s) of one dispatch's engine time: for Retry-After hints.
        self.engine_time_avg = 0.0
        self.drain = Drain(registry)  # ends QUEUED waits on shutdown (_drain.py)
        self.ids = IdMaker()  # request ids and engine-side ids (_identity.py)

    def _hinted(self, error: TrioforwardError) -> TrioforwardError:
        """``error`` with its ``retry_after`` set (the gateway's own 429/503)."""
        s = self.settings
        error.retry_after = retry_after_hint(
            error,
            self.registry,
            # A tenant's own requests are what must drain before its next one is admitted.
            outstanding=error.outstanding if isinstance(error, TenantQueueFull) else self.outstanding,
            engine_time=self.engine_time_avg,
            health_interval=s.health_interval,
            health_successes=s.health_successes,
        )
        return error

    # -- dispatch ---------------------------------------------------------------

    async def request(self, req: Request) -> Reply:
        """Forward ``req`` and read the whole answer (any status): a :class:`Reply`
        whose engine capacity and connection are already given back.

        Raises a :class:`TrioforwardError` subclass with ``.phase``,
        ``.attempts``, ``.engine``, ``.queue_time`` and ``.engine_time`` set
        (:class:`QueueFull` beyond ``max_outstanding`` outstanding requests,
        :class:`TenantQueueFull` beyond its tenant's,
        :class:`DispatchAborted` when ``req`` is aborted).
        """
        async with self._dispatch(req, stream=False) as reply:
            return reply

    def stream(self, req: Request) -> AbstractAsyncContextManager[Reply]:
        """``async with dispatcher.stream(req) as reply:`` — as :meth:`request`, but
        a 2xx/3xx answer's body is read inside the block from ``reply.body``.

        The engine's capacity and the connection are held until the block
        exits, and leaving it is the only place they are given back (the
        connection is parked if the body was read to its end, else closed, so
        the engine aborts). An error status (>= 400) comes with its body read
        into ``reply.content`` and ``reply.body`` is ``None``.
        """
        return self._dispatch(req, stream=True)

    @asynccontextmanager
    async def _dispatch(self, req: Request, *, stream: bool) -> AsyncIterator[Reply]:
        """The attempt loop of both :meth:`request` and :meth:`stream`.

        Admission (``outstanding``), QUEUED, and per engine the attempts under
        the dispatch deadline; moving to another engine gives the capacity back
        and queues again (that queue time is not charged to the dispatch
        budget: the remaining budget is carried over). Every
        :class:`TrioforwardError` leaving it carries the request's facts
        (:meth:`Request.stamp`).
        """
        tenant = req.tenant
        held = req.admitted  # a replay or a continuation: admitted once already
        if not held:
            self._admit(req)
        try:
            self.requests_total += 1
            arrival = trio.current_time()
            self.budget.deposit(arrival)
            with req.scope:
                try:
                    budget = self.dispatch_timeout
                    avoid: Engine | None = None
                    queue_deadline = (
                        _inf if self.queue_timeout is None else arrival + self.queue_timeout
                    )
                    t0 = arrival
                    while True:
                        # The queue deadline moves by the time spent dispatched (re-routes).
                        engine, start = await self._queue(
                            req, avoid, queue_deadline + req.engine_time, t0
                        )
                        deadline = start + budget
                        self.in_flight += 1
                        tenant.in_flight += 1
                        engine.in_flight += 1
                        engine.calls.add(req)
                        req.engine = engine
                        req.dispatched_at = start
                        # The version it runs on: the engine's own in a rolling
                        # update (dispatch/rollout/_staleness.py), else the recorded one.
                        runs = engine.reported_version
                        req.weight_version = self.weight_version if runs is None else runs
                        req.origin.last_version = req.weight_version
                        req.deadline, req.frozen_time = deadline, 0.0
                        if req.is_adapter:
                            assert req.model is not None
                            self.loader.begin(engine, req.model)  # never unloaded meanwhile
                        try:
                            reply = await self._attempts(req, engine, deadline, stream)
                            if reply is not None:
                                reply.release = partial(self._give_back, req, engine, start, reply)
                                try:
                                    yield reply
                                finally:
                                    if reply.body is not None:
                                        reply.body.close()
                                return
                        finally:
                            t0 = self._give_back(req, engine, start)
                        budget = max(0.0, deadline - t0)
                        avoid = engine
                except TrioforwardError as exc:
                    req.stamp(exc)
                    self._hinted(exc)
                    raise
            raise self._hinted(req.stamp(req.aborted()))
        finally:
            if not held:
                self._release(req)
            if req.attempts:
                tenant.served += 1
            tenant.observe_queue_time(req.queue_time)

    def _admit(self, req: Request) -> None:
        """Count ``req`` in ``outstanding`` (the client's and its tenant's), or raise
        :class:`TenantQueueFull` / :class:`QueueFull` (nothing held)."""
        if not req.request_id:
            req.request_id = self.ids.request_id()
        refused = refusal(req.tenant, self.outstanding, self.max_outstanding)
        if refused is not None:
            raise self._hinted(req.stamp(refused))
        self.outstanding += 1
        req.tenant.outstanding += 1
        req.admitted = True

    def _release(self, req: Request) -> None:
        self.outstanding -= 1
        req.tenant.outstanding -= 1
        req.admitted = False

    @contextmanager
    def admission(self, req: Request) -> Iterator[None]:
        """``with dispatcher.admission(req):`` — ``req`` admitted once for the block
        (raises as :meth:`request` does when refused): every dispatch of it inside,
        a whole replay after an engine pause included, and every continuation
        made from it (``derived``) count as this one request against
        ``max_outstanding``, the client's and its tenant's."""
        if req.admitted:
            yield
            return
        self._admit(req)
        try:
            yield
        finally:
            self._release(req)

    def _give_back(self, req: Request, engine: Engine, start: float, reply: Reply | None = None) -> float:
        """End ``req``'s dispatch on ``engine`` (capacity, counts; ``reply``'s body
        closed first): at the attempt loop's end, or earlier through
        ``reply.release()`` (a stream continued after an abort pause). Once only;
        returns the time it ended (trio clock)."""
        if reply is not None and reply.body is not None:
            reply.body.close()
        if req.dispatched_at is None:
            return trio.current_time()
        if req.is_adapter:
            assert req.model is not None
            self.loader.end(engine, req.model)
        self.in_flight -= 1
        req.tenant.in_flight -= 1
        engine.calls.discard(req)
        engine.queue.give_back(req.tenant)
        engine.call_finished()
        conserve(self.router, self.registry, engine)
        t0 = trio.current_time()
        req.engine_time += t0 - start
        self.engine_time_avg += 0.1 * (t0 - start - self.engine_time_avg)
        req.dispatched_at = None
        return t0

    async def _queue(
        self, req: Request, avoid: Engine | None, queue_deadline: float, t0: float
    ) -> tuple[Engine, float]:
        """QUEUED from ``t0``: :func:`acquire`, counted in ``queued`` (the client's and
        the tenant's) and ``req.queue_time``."""
        self.queued += 1
        tenant = req.tenant
        tenant.queued += 1
        try:
            engine, start = await acquire(
                req,
                avoid,
                queue_deadline,
                t0,
                registry=self.registry,
                router=self.router,
                unhealthy_timeout=self.unhealthy_timeout,
                drain=self.drain,
            )
        except BaseException as exc:
            now = trio.current_time()
            req.queue_time += now - t0
            if req.trace is not None:
                req.trace.queued(t0, now, None, exc)
            raise
        finally:
            self.queued -= 1
            tenant.queued -= 1
        req.queue_time += start - t0
        if req.trace is not None:
            req.trace.queued(t0, start, engine)
        return engine, start
