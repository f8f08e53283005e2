"""The dispatch core's series summed over the workers of one box (``--workers N``;
docs/fleet.md, "Metrics").

One worker's ``client.statistics()`` knows only that worker's requests. Under
``--workers N`` every worker copies its statistics into prometheus-client's
multiprocess files (:meth:`BoxSeries.sync`, every :data:`SYNC_INTERVAL` seconds
and before each scrape), so a scrape of any worker reports the box:

- counters (requests, retries, engine responses, adapter loads/unloads, pool
  connections opened/reused/closed) are summed over every worker that ever ran,
  dead ones included, as Prometheus counters should be;
- ``in_flight``, ``queued``, pool connections by state, the per-tenant gauges:
  ``livesum`` (live workers only); the per-tenant counters are summed as the
  others;
- adapters loaded / registered: ``livemax`` (each worker keeps its own view of
  the same engines); ``engine_healthy``: ``livemin`` (healthy only if every
  live worker takes work there); ``engine_paused``: ``livemax``.

Modes are prometheus-client's (https://prometheus.github.io/client_python/multiprocess/).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

from trioforward.server.telemetry._metrics_tenants import TenantBoxSeries

if TYPE_CHECKING:
    from trioforward.dispatch import Client

__all__ = ["BoxSeries", "SYNC_INTERVAL"]

# Seconds between two copies of a worker's statistics into the shared files: a
# scrape sees the other workers' series at most this old.
SYNC_INTERVAL = 0.25

_POOL_STATES = ("idle", "active", "connecting", "waiting")

_Mode = Literal["livesum", "livemax", "livemin"]


class BoxSeries:
    """The dispatch core's series of one worker, written to the multiprocess files.

    Create it only when prometheus-client runs in multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR`` set before it was imported); ``registry`` is
    not scraped (the scrape reads the files).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, mode: _Mode, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, registry=registry, multiprocess_mode=mode)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        self._in_flight = gauge("trioforward_in_flight", "Requests dispatched to an engine", "livesum")
        self._queued = gauge("trioforward_queued", "Requests waiting for engine capacity", "livesum")
        self._pool = gauge(
            "trioforward_pool_connections", "Upstream connections by state", "livesum", ("state",)
        )
        self._loaded = gauge(
            "trioforward_adapters_loaded",
            "LoRA adapters the gateway keeps loaded, by engine",
            "livemax",
            ("engine",),
        )
        self._registered = gauge(
            "trioforward_adapters_registered", "LoRA adapters registered with the gateway", "livemax"
        )
        self._healthy = gauge(
            "trioforward_engine_healthy",
            "1 while the engine passes its health checks (a paused engine stays 1)",
            "livemin",
            ("engine",),
        )
        self._paused = gauge(
            "trioforward_engine_paused", "1 while paused for a weight update", "livemax", ("engine",)
        )
        self._requests = counter("trioforward_dispatch_requests", "Requests accepted by the dispatch core")
        self._retries = counter(
            "trioforward_retries", "Upstream retries by failed phase and reason", ("phase", "reason")
        )
        self._responses = counter(
            "trioforward_engine_responses", "Engine answers by engine and HTTP status", ("engine", "status")
        )
        self._loads = counter("trioforward_adapter_loads", "LoRA adapter loads by engine", ("engine",))
        self._unloads = counter(
            "trioforward_adapter_unloads",
            "LoRA adapters unloaded by engine (least recently used beyond max_loaded_adapters)",
            ("engine",),
        )
        self._pool_totals = {
            name: counter(f"trioforward_pool_connections_{name}", f"Upstream connections {name}")
            for name in ("opened", "reused", "closed")
        }
        self.tenants = TenantBoxSeries(registry)
        # Counter children -> the statistics value already added to them.
        self._written: dict[tuple[int, tuple[str, ...]], float] = {}

    def _advance(self, counter: Counter, labels: tuple[str, ...], total: float) -> None:
        key = (id(counter), labels)
        delta = total - self._written.get(key, 0.0)
        if delta > 0:
            child: Any = counter.labels(*labels) if labels else counter
            child.inc(delta)
            self._written[key] = total

    def sync(self, client: Client) -> None:
        """Copy ``client.statistics()`` and the engines' health into the files."""
        stats = client.statistics()
        self._in_flight.set(stats.in_flight)
        self._queued.set(stats.queued)
        for state in _POOL_STATES:
            self._pool.labels(state).set(getattr(stats.pool, state))
        for name, counter in self._pool_totals.items():
            self._advance(counter, (), getattr(stats.pool, f"{name}_total"))
        for engine, names in stats.adapters_loaded.items():
            self._loaded.labels(engine).set(len(names))
        self._registered.set(stats.adapters_registered)
        self._advance(self._requests, (), stats.requests_total)
        for (phase, reason), count in stats.retries.items():
            self._advance(self._retries, (str(phase), str(reason)), count)
        for (engine, status), count in stats.responses.items():
            self._advance(self._responses, (engine, str(status)), count)
        for engine, count in stats.adapter_loads.items():
            self._advance(self._loads, (engine,), count)
        for engine, count in stats.adapter_unloads.items():
            self._advance(self._unloads, (engine,), count)
        self.tenants.sync(stats.tenants)
        for info in client.engines.list():
            self._healthy.labels(info.url).set(1.0 if info.healthy else 0.0)
            self._paused.labels(info.url).set(1.0 if info.paused else 0.0)
