"""Per-tenant series of ``/metrics`` (docs/server.md, "Metrics (`GET /metrics`)").

Read at scrape time from the dispatch core's tenant counters
(``client.statistics().tenants``): the request path pays one counter update and
one bucket increment per request, nothing per scrape-visible series. Labelled by
tenant *name* only, so the label set is the tenant table's (a bare API key's
tenant is ``key-N``): no key is ever a label value.

Under ``--workers N`` (:class:`TenantBoxSeries`) the gauges are summed over live
workers and the counters over every worker, as for the dispatch core's other
series; the queue-time histogram is observed per request by the server there
(``Metrics.observe``), as prometheus-client's multiprocess files cannot be
filled from counts kept elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from trioforward.dispatch import QUEUE_TIME_BUCKETS

if TYPE_CHECKING:
    from trioforward.dispatch import TenantStatistics

__all__ = ["tenant_families", "TenantBoxSeries"]

# name, help, gauge (else counter), TenantStatistics field
_SERIES = (
    ("trioforward_tenant_queued", "Requests of the tenant waiting for engine capacity", True, "queued"),
    ("trioforward_tenant_in_flight", "Requests of the tenant dispatched to an engine", True, "in_flight"),
    ("trioforward_tenant_outstanding", "Requests of the tenant admitted and not yet answered", True, "outstanding"),
    ("trioforward_tenant_served", "Requests of the tenant that reached an engine and ended", False, "served"),
    (
        "trioforward_tenant_rejections",
        "Requests and Tinker samples of the tenant refused at admission (429 tenant_queue_full or queue_full)",
        False,
        "rejections",
    ),
)
_BOUNDS = [str(float(b)) for b in QUEUE_TIME_BUCKETS] + ["+Inf"]


def tenant_families(tenants: dict[str, TenantStatistics]) -> Iterator[Metric]:
    """The per-tenant series (docs/server.md, "Metrics (`GET /metrics`)"), labelled by
    tenant *name* only: the label set is the tenant table's, and no key is ever a label."""
    names = sorted(tenants)
    for name, doc, gauge, field in _SERIES:
        family: Any = (GaugeMetricFamily if gauge else CounterMetricFamily)(name, doc, labels=["tenant"])
        for tenant in names:
            family.add_metric([tenant], getattr(tenants[tenant], field))
        yield family
    wait = HistogramMetricFamily(
        "trioforward_tenant_queue_wait_seconds",
        "Time a request of the tenant waited for engine capacity (QUEUED), per request",
        labels=["tenant"],
    )
    for tenant in names:
        t = tenants[tenant]
        wait.add_metric([tenant], list(zip(_BOUNDS, t.queue_time_buckets, strict=True)), t.queue_time_sum)
    yield wait


class TenantBoxSeries:
    """The per-tenant gauges and counters of one worker, in the multiprocess files."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._series: list[tuple[Any, bool, str]] = []
        for name, doc, gauge, field in _SERIES:
            if gauge:
                metric: Any = Gauge(name, doc, ("tenant",), registry=registry, multiprocess_mode="livesum")
            else:
                metric = Counter(name, doc, ("tenant",), registry=registry)
            self._series.append((metric, gauge, field))
        self._written: dict[tuple[int, str], float] = {}
        self.queue_wait = Histogram(
            "trioforward_tenant_queue_wait_seconds",
            "Time a request of the tenant waited for engine capacity (QUEUED), per request",
            ("tenant",),
            buckets=QUEUE_TIME_BUCKETS,
            registry=registry,
        )

    def sync(self, tenants: dict[str, TenantStatistics]) -> None:
        for metric, gauge, field in self._series:
            for name, stats in tenants.items():
                value = getattr(stats, field)
                if gauge:
                    metric.labels(name).set(value)
                    continue
                key = (id(metric), name)
                delta = value - self._written.get(key, 0.0)
                if delta > 0:
                    metric.labels(name).inc(delta)
                    self._written[key] = value
