"""Prometheus metrics of one gateway (docs/server.md, "Metrics (`GET /metrics`)"), exposed as text on ``/metrics``.

Two sources, one registry per app (so several apps in one process never share
series):

- counters the dispatch core already keeps are *read* at scrape time by a
  collector over ``client.statistics()``: retries by phase and reason, engine
  responses by engine and status, in-flight and queued requests, pool
  connections by state, adapter loads, engine health. Nothing is counted twice
  and the request path pays nothing for them;
- what only the server sees is observed per request: gateway responses by route
  and status, and two separate histograms — time waiting for engine capacity
  (``queue_wait``) and time from dispatch to the end of the response
  (``engine_time``), both in seconds;
- Tinker's calls are not counted per answer (a sample is counted once, by its
  outcome, under route ``tinker_sample``), so their refusals have a family of
  their own, counted only when one is made (:meth:`Metrics.rejection`).

Route modules (the Tinker routes) may call :meth:`Metrics.observe`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric

from trioforward.dispatch import QUEUE_TIME_BUCKETS
from trioforward.server.telemetry._collectors import ClientCollector, FleetCollector

if TYPE_CHECKING:
    from trioforward.dispatch import Client, GroupTail
    from trioforward.server.telemetry._metrics_box import BoxSeries

__all__ = ["Metrics", "CONTENT_TYPE_LATEST", "MAX_VERSION_LABELS", "MULTIPROC_ENV"]

MAX_VERSION_LABELS = 8

# Set by the --workers N supervisor (prometheus-client's multiprocess mode).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Queue waits run from microseconds (idle fleet) to many minutes (engines saturated
# by a burst); engine times from milliseconds to the 2048 s dispatch deadline.
_QUEUE_BUCKETS = QUEUE_TIME_BUCKETS
_ENGINE_BUCKETS = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 2048)
_OFF_POLICY = (
    ("trioforward_admission_wait_seconds", "Time a request waited at a staleness bound before "
     "it started (only requests that waited; not in queue_wait)", _QUEUE_BUCKETS),
    ("trioforward_answer_staleness_versions", "Versions the weights that ended an answer were "
     "behind the current ones when it ended (X-Weight-Staleness)", (0, 1, 2, 3, 4, 8, 16)),
    ("trioforward_group_last_seconds", "Per rollout group: seconds from its first member's "
     "arrival to its last member's answer (the time an RL step waits on)", _ENGINE_BUCKETS),
    ("trioforward_group_spread_seconds", "Per rollout group: seconds between its first and "
     "its last member's answer", _ENGINE_BUCKETS),
)


class Metrics:
    """The gateway's metrics. ``client_getter()`` returns the open dispatch client or
    ``None`` (before startup / after shutdown)."""

    def __init__(
        self,
        client_getter: Callable[[], Client | None],
        fleet_getter: Callable[[], Any] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests = Counter(
            "trioforward_gateway_requests",
            "Gateway responses by route and HTTP status (gateway-made errors included)",
            ["route", "status"],
            registry=self.registry,
        )
        self._queue_wait = Histogram(
            "trioforward_queue_wait_seconds",
            "Time a request waited for engine capacity (QUEUED), per request",
            buckets=_QUEUE_BUCKETS,
            registry=self.registry,
        )
        self._engine_time = Histogram(
            "trioforward_engine_time_seconds",
            "Time from dispatch (capacity acquired) to the end of the response, per request",
            buckets=_ENGINE_BUCKETS,
            registry=self.registry,
        )
        self.sampling_sessions = Gauge(
            "trioforward_sampling_sessions",
            "Tinker sampling sessions kept (bounded; oldest dropped first)",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self._stream_errors = Counter(
            "trioforward_stream_errors",
            "Streams that ended with an error event after a 200 head, by route and error code",
            ["route", "code"],
            registry=self.registry,
        )
        self._rejections = Counter(
            "trioforward_tinker_rejections",
            "Tinker calls answered without what they asked for (refusals, and held polls "
            "that ran out: 408), by route, HTTP status and error code",
            ["route", "status", "code"],
            registry=self.registry,
        )
        self._rejection_children: dict[tuple[str, int, str], Any] = {}
        self._versions = Counter(
            "trioforward_weight_version_requests",
            "Answers by the weight version that produced them (X-Weight-Version; the "
            f"{MAX_VERSION_LABELS} most recent versions are kept)",
            ["weight_version"],
            registry=self.registry,
        )
        self._version_children: dict[str, Any] = {}  # insertion order = age
        self._mixed_versions = Counter(
            "trioforward_weight_version_mixed_requests",
            "Answers generated across a weight update (a keep pause: X-Weight-Version "
            "names two versions); not counted per version",
            registry=self.registry,
        )
        # Off-policy control (docs/operations.md): the admission wait, answers'
        # staleness, group tails.
        self._admission_wait, self._staleness, self._group_last, self._group_spread = (
            Histogram(name, text, buckets=buckets, registry=self.registry)
            for name, text, buckets in _OFF_POLICY
        )
        self._spans_dropped = Counter(
            "trioforward_trace_spans_dropped",
            "Trace spans dropped by reason: queue_full (the export queue was full), "
            "export_failed (the collector did not take them)",
            ["reason"],
            registry=self.registry,
        )
        # labels() takes a lock and builds a tuple each call: cache the children.
        self._children: dict[tuple[str, int], Any] = {}
        self.registry.register(ClientCollector(client_getter))
        self.registry.register(FleetCollector(fleet_getter))
        self._scrape = self.registry
        self._client_getter = client_getter
        self.box: BoxSeries | None = None
        multiproc_dir = os.environ.get(MULTIPROC_ENV)
        if multiproc_dir:
            # A worker of --workers N (docs/fleet.md, "Metrics"): the per-request
            # counters and histograms above live in prometheus-client's shared
            # files and a scrape of any worker sums them over the box's workers.
            from prometheus_client import multiprocess

            # The dispatch core's series go there too (BoxSeries, synced
            # periodically by keep_synced and before each scrape).
            from trioforward.server.telemetry._metrics_box import BoxSeries

            self.box = BoxSeries(self.registry)
            self._scrape = CollectorRegistry(auto_describe=False)
            multiprocess.MultiProcessCollector(self._scrape, path=multiproc_dir)  # type: ignore[no-untyped-call]
            self._scrape.register(FleetCollector(fleet_getter))

    def observe(
        self,
        route: str,
        status: int,
        *,
        queue_time: float | None = None,
        engine_time: float | None = None,
        weight_version: str | None = None,
        tenant: str | None = None,
        admission_time: float = 0.0,
        staleness: int | None = None,
    ) -> None:
        """Count one finished request; times in seconds (``None`` = not dispatched;
        ``admission_time``: at a staleness bound, observed when > 0; ``staleness``:
        its ``X-Weight-Staleness``, ``None``: none);
        ``weight_version``: the answer's ``X-Weight-Version`` (``None``: none);
        ``tenant``: its tenant's name (observed here only under ``--workers N``:
        otherwise the per-tenant series are read from the dispatch core)."""
        key = (route, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._requests.labels(route, str(status))
        child.inc()
        if queue_time is not None:
            self._queue_wait.observe(queue_time)
            if self.box is not None and tenant is not None:
                self.box.tenants.queue_wait.labels(tenant).observe(queue_time)
        if engine_time is not None and engine_time > 0:
            self._engine_time.observe(engine_time)
        if admission_time > 0:
            self._admission_wait.observe(admission_time)
        if staleness is not None:
            self._staleness.observe(staleness)
        if weight_version is not None:
            if ", " in weight_version:  # "step-1, step-2" (dispatch version_label)
                self._mixed_versions.inc()
            else:
                self._count_version(weight_version)

    def group_tail(self, tail: GroupTail) -> None:
        """Observe one rollout group's tail (as it ends; dispatch/rollout/_abort.py)."""
        self._group_last.observe(tail.last)
        self._group_spread.observe(tail.spread)

    def _count_version(self, version: str) -> None:
        children = self._version_children
        child = children.get(version)
        if child is None:
            # Bounded labels: a new version retires the oldest series beyond the
            # limit (a trainer makes one version per step, for days).
            while len(children) >= MAX_VERSION_LABELS:
                oldest = next(iter(children))
                del children[oldest]
                self._versions.remove(oldest)
            child = children[version] = self._versions.labels(version)
        child.inc()

    def rejection(self, route: str, status: int, code: str | None) -> None:
        """Count one Tinker call answered ``status`` (4xx/5xx, or 408 ``try_again``)
        with error code ``code`` (``None``: none); ``route``: its path. Only
        refusals are counted: a call answered with what it asked for costs nothing."""
        key = (route, status, code or "")
        child = self._rejection_children.get(key)
        if child is None:
            child = self._rejection_children[key] = self._rejections.labels(
                route, str(status), code or ""
            )
        child.inc()

    def stream_error(self, route: str, code: str) -> None:
        """Count a stream ended by an error event (its request is counted as a 200)."""
        self._stream_errors.labels(route, code).inc()

    def sync(self) -> None:
        """Under ``--workers N``: copy this worker's dispatch statistics into the
        box's shared files (no-op otherwise, or before startup)."""
        client = self._client_getter() if self.box is not None else None
        if self.box is not None and client is not None:
            self.box.sync(client)

    async def keep_synced(self) -> None:
        """Run :meth:`sync` every ``SYNC_INTERVAL`` seconds until cancelled (returns
        at once outside ``--workers N``)."""
        if self.box is None:
            return
        from trioforward.server.telemetry._metrics_box import SYNC_INTERVAL

        while True:
            self.sync()
            await trio.sleep(SYNC_INTERVAL)

    def spans_dropped(self, count: int, reason: str) -> None:
        """Count ``count`` spans dropped for ``reason`` (from any thread: the span
        export's own, or the event loop's when the queue is full)."""
        self._spans_dropped.labels(reason).inc(count)

    def render(self) -> bytes:
        """The Prometheus text exposition (content type :data:`CONTENT_TYPE_LATEST`),
        without ``*_created`` series (:class:`_WithoutCreated`)."""
        self.sync()
        return generate_latest(_WithoutCreated(self._scrape))


class _WithoutCreated:
    """``source``'s metrics without their ``<name>_created`` samples.

    prometheus-client adds a ``_created`` gauge (the series' creation time) to each
    child of a Counter or Histogram it keeps in this process, but not to the
    series it sums from multiprocess files or reads from ``client.statistics()``:
    ``/metrics`` had them for five metrics under ``trioforward serve`` and for none
    under ``--workers N``. Prometheus needs no ``_created`` to compute rates, so
    the gateway serves none, in every mode. This is per registry, unlike
    prometheus-client's process-wide ``disable_created_metrics()``, which would
    also change an embedding application's own metrics
    (https://prometheus.github.io/client_python/instrumenting/#disabling-_created-metrics).
    """

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for metric in self._source.collect():
            created = metric.name + "_created"
            metric.samples = [s for s in metric.samples if s.name != created]
            yield metric
