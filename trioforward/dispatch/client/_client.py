"""The embedded client: ``async with trioforward.open_client(...) as client`` (docs/embedding.md).

The gateway server is a thin layer over this same object. Its parts: forwarding
(``post``, ``request``, ``stream``: ``_forwarding.py``), token-level sampling
(``complete``, ``sample``: ``_sampling.py``), pause and resume (``_gating.py``);
this module sets them up and holds the control calls and the statistics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from trioforward import Settings
from trioforward._background import open_background_nursery
from trioforward.dispatch.attempts._counts import ContinueCounts
from trioforward.dispatch.attempts._dispatch import Dispatcher
from trioforward.dispatch.attempts._tracing import Tracing, tracing_for
from trioforward.dispatch.attempts._types import ClientStatistics
from trioforward.dispatch.client._control import engine_models
from trioforward.dispatch.client._gating import PauseGate
from trioforward.dispatch.client._sampling import Sampling
from trioforward.dispatch.engines._adapters import AdapterLoader, AdapterRegistry
from trioforward.dispatch.engines._adaptive import load_loop
from trioforward.dispatch.engines._admin import Engines
from trioforward.dispatch.engines._engines import Engine, Registry
from trioforward.dispatch.engines._health import health_loop
from trioforward.dispatch.engines._kinds import detect_loop, kind_setting
from trioforward.dispatch.engines._routing import stable_hash
from trioforward.dispatch.engines._tenants import TenantTable
from trioforward.dispatch.rollout._abort import AbortCounts, Aborts
from trioforward.dispatch.rollout._admission import Admission, StalenessBound
from trioforward.dispatch.rollout._engine_control import EngineControl
from trioforward.dispatch.rollout._migration import cut_streams
from trioforward.dispatch.rollout._versions import VersionGate
from trioforward.dispatch.rollout._weights import WeightUpdates
from trioforward.errors import TrioforwardError
from trioforward.http import ConnectionPool, open_pool

__all__ = ["Client", "open_client"]

READMIT_MAX = 30.0  # s: longest back-off before an ejected engine is tried again (no probes)


class Client(PauseGate, Sampling):
    """Forwards requests to engines under the rules of docs/dispatch.md. Create with :func:`open_client`."""

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool,
        control_pool: ConnectionPool,
        nursery: trio.Nursery,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self._tracing = tracing  # None: no spans (docs/operations.md, "End-to-end traces")
        self._pool = pool
        self._control_pool = control_pool
        self._nursery = nursery
        self._registry = Registry(
            settings.engine_capacity, settings.health_failures, settings.health_successes
        )
        self.adapters = AdapterRegistry(settings.adapters, settings.max_registered_adapters)
        self._loader = AdapterLoader(
            self.adapters,
            control_pool,
            settings.adapter_load_timeout,
            settings.max_loaded_adapters,
            nursery.start_soon,
        )
        self._dispatcher = Dispatcher(settings, self._registry, pool, self._loader)
        #: The tenant table (docs/dispatch.md, "Tenants and fair queueing").
        self.tenants = TenantTable(settings)
        self._paused_all = False
        self._kinds = dict(settings.engine_kinds)  # URL -> kind set by the operator
        control = EngineControl(
            control_pool,
            self.configured_kind,
            settings.engine_control_timeout,
            settings.dispatch_timeout,
            self._registry.by_url.get,
        )
        self.weights = WeightUpdates(self._registry, self._dispatcher, control)
        self.aborts = Aborts(control, settings.abort_grace)
        # A new version wakes requests waiting for the weights they accept
        # (_staleness.py) and moves the staleness bounds (_admission.py).
        self.weights.version_order.on_advance.append(self._registry.notify_changed)
        self.admission = Admission(
            self.weights.version_order,
            self._dispatcher.drain,
            control,
            lambda reqs: nursery.start_soon(self.aborts.end, reqs),
            nursery.start_soon,
        )
        self.versions = VersionGate(
            self._registry,
            control,
            control_pool,
            lambda: self._dispatcher.weight_version,
            nursery.start_soon,
            settings.health_interval,
            settings.health_timeout,
        )
        self.weights.versions = self.versions
        self._registry.on_readmit = lambda e: self.versions.hold(e, "re-admitted after an ejection")
        self._session_routing = settings.routing in ("session", "prefix")
        self._prefix_routing = settings.routing == "prefix"
        self.engines = Engines(self._registry, self._engine_added)
        self._registry.on_eject = self._ejected

    def _ejected(self, engine: Engine) -> None:
        """``engine`` was ejected: the streams on it migrate (docs/operations.md,
        "Migration"); with probes off, it is re-admitted later."""
        if self.settings.max_migrations > 0:
            cut_streams(engine)
        if self.settings.health_interval <= 0:
            # No probes to re-admit an ejected engine: an ejection must be temporary.
            self._readmit_later(engine)

    def _readmit_later(self, engine: Engine) -> None:
        """Re-admit ``engine`` on trial after a back-off (1 s, doubling per ejection
        in a row, at most :data:`READMIT_MAX`): probes are off, so nothing else would."""
        delay = min(READMIT_MAX, 2.0 ** (engine.ejections - 1))

        async def readmit() -> None:
            await trio.sleep(delay)
            self._registry.readmit(engine)

        self._nursery.start_soon(readmit)

    def configured_kind(self, url: str) -> str | None:
        """The kind the operator gave engine ``url`` (``engine_kinds``, else
        ``engine_kind``); ``None``: detected (docs/operations.md, "Engine kinds")."""
        kind = self._kinds.get(url)
        return kind if kind is not None else kind_setting(self.settings.engine_kind)

    def _engine_added(self, engine: Engine, kind: str | None = None) -> None:
        if kind is not None:
            self._kinds[engine.url] = kind
        if self._paused_all:
            self._registry.set_paused(engine, True)
        self.versions.hold(engine, "added")
        s = self.settings
        configured = self.configured_kind(engine.url)
        engine.kind = configured  # known at once when set; what it serves follows
        self._nursery.start_soon(detect_loop, self._control_pool, engine, configured, s.health_timeout)
        if s.adaptive_capacity or self._session_routing:
            # Session and prefix routing count the engine's reported load too.
            self._nursery.start_soon(
                lambda: load_loop(
                    self._control_pool,
                    engine,
                    interval=s.load_interval,
                    wait_s=s.health_timeout,
                    adapt=s.adaptive_capacity,
                )
            )
        if s.health_interval > 0:
            self._nursery.start_soon(
                lambda: health_loop(
                    self._registry,
                    self._control_pool,
                    engine,
                    interval=s.health_interval,
                    probe_timeout=s.health_timeout,
                )
            )

    def finish_session(self, session: str) -> bool:
        """End session ``session`` (its ``X-Session-ID``) for routing: its next
        request is placed afresh, as a new session's (docs/dispatch.md,
        "Sessions that move"). Returns whether routing remembered it (always
        ``False`` unless ``routing`` is ``session`` or ``prefix``)."""
        sessions = self._dispatcher.router.sessions
        return sessions is not None and sessions.finish(stable_hash(session))

    async def abort(
        self,
        *,
        group: str | None = None,
        request_ids: Sequence[str] | None = None,
        all: bool = False,
    ) -> AbortCounts:
        """Abort this client's requests of rollout ``group``, those named by
        ``request_ids``, or ``all`` of them (docs/operations.md, "Over-sampling:
        cancelling a round's stragglers"): queued ones never reach an engine;
        ones on an engine are aborted there; each caller gets a normal answer with
        what was generated so far and ``finish_reason: "abort"``, never replayed.
        Returns :class:`AbortCounts` (``queued``, ``on_engine``, ``finished``)
        once they are answered; unknown ids and groups count 0. Raises
        ``ValueError`` when none of the three is given, or ``all`` with another."""
        if all and (group is not None or request_ids is not None):
            raise ValueError("abort: 'all' aborts everything; give it alone")
        if not all and group is None and request_ids is None:
            raise ValueError("abort: give group, request_ids or all=True")
        if isinstance(request_ids, str):
            raise ValueError("abort: request_ids is a list of ids, not one string")
        return await self.aborts.abort(request_ids=request_ids, group=group, every=all)

    def declare_staleness(
        self,
        *,
        step: int,
        eta: int,
        on_stale: str = "continue",
        tenant: str | None = None,
        group_prefix: str | None = None,
    ) -> StalenessBound:
        """Bound how far rollouts run ahead of training (docs/operations.md,
        "Staleness-bounded admission"): of ``tenant``'s requests (a name of the
        tenant table), or of those whose rollout group starts with
        ``group_prefix``, at most ``(i + eta + 1) * step`` start, ``i`` counting the
        versions resumed from now on; the rest wait (never refused) and start as
        resumes land. A running one that falls more than ``eta`` versions behind
        is continued on the current weights (``on_stale="continue"``) or aborted
        with its partial answer (``"abort"``). Replaces an earlier declaration
        of the same scope. Raises ``ValueError`` for a bad value or an unknown
        tenant. Returns the declaration."""
        if tenant is not None:
            self.tenants.named(tenant)  # ValueError for an unknown one
        bound = StalenessBound(step, eta, on_stale, tenant, group_prefix)
        self.admission.declare(bound)
        return bound

    def withdraw_staleness(self, *, tenant: str | None = None, group_prefix: str | None = None) -> bool:
        """End the staleness bound of ``tenant`` or ``group_prefix``: its waiting
        requests start at once. False if none was declared."""
        return self.admission.withdraw(tenant, group_prefix)

    @property
    def continued(self) -> ContinueCounts:
        """What ``replay="continue"`` did so far (:class:`~trioforward.dispatch.rollout._continue.ContinueCounts`)."""
        return self._dispatcher.continued

    async def engine_models(self) -> list[dict[str, Any]]:
        """The engines' ``GET /v1/models`` entries (dicts with ``"id"``, in engine order).

        A control call: asked of every engine at once over the control pool,
        each within ``health_timeout`` — never behind engine capacity or a
        pause (docs/semantics.md, "Which path each engine call takes"). An
        engine that does not answer in time is left out; never raises for one.
        """
        return await engine_models(
            list(self._registry.engines), self._control_pool, self.settings.health_timeout
        )

    def new_request_id(self) -> str:
        """A fresh request id, unique to this process (what a request sent without
        one gets; docs/server.md, "Request ids and rollout groups")."""
        return self._dispatcher.ids.request_id()

    def retry_after_hint(self, error: TrioforwardError) -> int | None:
        """Seconds a client should wait before retrying after the gateway-made 429/503
        ``error`` (``None`` for other errors): what ``Retry-After`` says
        (docs/server.md, "Headers passed on"). Sets ``error.retry_after`` too."""
        return self._dispatcher._hinted(error).retry_after

    def begin_drain(self, cutoff: float, reason: str = "the gateway is shutting down") -> None:
        """End the QUEUED phase by ``cutoff`` (``trio.current_time()`` clock, s): a
        request still QUEUED then, or queued later, raises :class:`~trioforward.errors.ShuttingDown`
        (503, ``reason`` opens its message); one waiting for an engine while none can
        serve it (all ejected or removed) raises it at once. Dispatched requests are
        untouched (docs/embedding.md, "Closing the client"). An earlier cutoff wins."""
        self._dispatcher.drain.begin(cutoff, reason)

    # -- introspection ---------------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        """A snapshot of the counters (O(engines) at most)."""
        d = self._dispatcher
        sessions = d.router.sessions
        return ClientStatistics(
            requests_total=d.requests_total,
            in_flight=d.in_flight,
            queued=d.queued,
            retries=dict(d.retries),
            responses=dict(d.responses),
            adapter_loads=dict(self._loader.loads),
            adapter_unloads=dict(self._loader.unloads),
            adapters_loaded=self._loader.loaded(),
            adapters_registered=len(self.adapters.list()),
            pool=self._pool.statistics(),
            tenants={t.name: t.statistics() for t in self.tenants},
            session_moves=sessions.moves if sessions is not None else 0,
            sessions_routed=len(sessions) if sessions is not None else 0,
            migrations=dict(d.continued.migrations),
        )


@asynccontextmanager
async def open_client(
    engines: Iterable[str] | None = None,
    settings: Settings | None = None,
    *,
    tracer_provider: Any = "process",
    **knob_overrides: Any,
) -> AsyncIterator[Client]:
    """``async with open_client(engines=[...], settings=..., **knobs) as client:``

    ``engines`` (base URLs; one string is read as ``TRIOFORWARD_ENGINES`` is,
    comma-separated) replace ``settings.engines``; ``knob_overrides`` are
    any :class:`Settings` fields (validated; raises ``SettingsError``). On exit the
    health probes stop and idle connections close; a request still QUEUED in
    another task, or sent after the exit, raises :class:`~trioforward.errors.ShuttingDown`
    (``client.begin_drain(now)``; docs/embedding.md, "Closing the client"); a
    request already dispatched in another task runs on to its end.
    An exception raised in the block comes out as itself, not inside an
    ``ExceptionGroup`` (docs/embedding.md).

    ``tracer_provider``: an OpenTelemetry ``TracerProvider`` for the client's
    spans; ``None``: no spans; ``"process"`` (default): the process's, if one
    was set before this call, else no spans (docs/operations.md, "End-to-end traces").
    """
    settings = settings if settings is not None else Settings()
    if knob_overrides:
        settings = settings.replace(**knob_overrides)
    if engines is not None:
        settings = settings.replace(engines=engines if isinstance(engines, str) else tuple(engines))
    async with (
        open_pool(
            max_connections=settings.connections_per_engine,
            idle_expiry=settings.idle_expiry,
            connect_timeout=settings.connect_timeout,
        ) as pool,
        open_pool(
            max_connections=0,
            idle_expiry=settings.idle_expiry,
            # Each call bounds itself by its deadline (a health probe: health_timeout);
            # a pause or resume may wait for a busy engine to accept for as long as
            # engine_control_timeout (a vLLM API server busy with a batch took over 5 s
            # to accept one, and the weight update failed with 502).
            connect_timeout=max(settings.health_timeout, settings.engine_control_timeout),
        ) as control,
        open_background_nursery() as nursery,
    ):
        client = Client(settings, pool, control, nursery, tracing_for(tracer_provider))
        for url in settings.engines:
            client.engines.add(url)
        try:
            yield client
        finally:
            client.begin_drain(trio.current_time(), "the client was closed")
