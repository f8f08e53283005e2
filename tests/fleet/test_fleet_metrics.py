"""Under ``--workers N`` a scrape of any worker reports the box's sum of the
dispatch core's series (docs/fleet.md, "Metrics"): two workers' ``Metrics``
writing to one multiprocess directory, each with its own process identity."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import multiprocess, values
from prometheus_client.parser import text_string_to_metric_families

from trioforward.dispatch import QUEUE_TIME_BUCKETS, TenantStatistics
from trioforward.server.telemetry._metrics import MULTIPROC_ENV, Metrics

ENGINE = "http://127.0.0.1:1"


def _tenant(served: int, queued: int) -> TenantStatistics:
    buckets = (0,) * len(QUEUE_TIME_BUCKETS) + (served,)
    return TenantStatistics("a", 1.0, 0, 0, queued, queued, 0, served, 1, buckets, 0.0)


def _client(requests: int, in_flight: int, queued: int, active: int, retries: int) -> Any:
    pool = SimpleNamespace(
        idle=1, active=active, connecting=0, waiting=0, opened_total=active + 1, reused_total=3, closed_total=0
    )
    stats = SimpleNamespace(
        requests_total=requests,
        in_flight=in_flight,
        queued=queued,
        retries={("connect", "refused"): retries},
        responses={(ENGINE, 200): requests},
        adapter_loads={ENGINE: 1},
        adapter_unloads={},
        adapters_loaded={ENGINE: ["a"]},
        adapters_registered=1,
        pool=pool,
        tenants={"a": _tenant(requests, queued)},
    )
    engine = SimpleNamespace(url=ENGINE, healthy=True, paused=False)
    return SimpleNamespace(statistics=lambda: stats, engines=SimpleNamespace(list=lambda: [engine]))


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.fixture
def worker_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    clients: dict[str, Any] = {}

    value_classes: dict[str, Any] = {}
    metrics: dict[str, Metrics] = {}

    def as_worker(worker: str) -> Metrics:
        # What a worker process gets from prometheus-client when the supervisor
        # set the directory: values in mmaped files named by its id. (Labelled
        # children are made on first use, so every call switches to the worker.)
        if worker not in value_classes:
            value_classes[worker] = values.MultiProcessValue(lambda: worker)
        monkeypatch.setattr(values, "ValueClass", value_classes[worker])
        if worker not in metrics:
            metrics[worker] = Metrics(lambda: clients.get(worker))
        return metrics[worker]

    return as_worker, clients, tmp_path


def test_a_scrape_of_one_worker_sums_every_dispatch_series_over_the_box(worker_metrics: Any) -> None:
    as_worker, clients, directory = worker_metrics
    clients["w1"] = _client(requests=5, in_flight=2, queued=1, active=2, retries=1)
    clients["w2"] = _client(requests=7, in_flight=3, queued=4, active=3, retries=2)
    as_worker("w1")
    as_worker("w2").sync()  # w2's periodic task
    seen = _samples(as_worker("w1"))  # the scrape syncs w1
    assert seen[("trioforward_dispatch_requests_total", ())] == 12
    assert seen[("trioforward_engine_responses_total", (("engine", ENGINE), ("status", "200")))] == 12
    assert seen[("trioforward_retries_total", (("phase", "connect"), ("reason", "refused")))] == 3
    assert seen[("trioforward_in_flight", ())] == 5
    assert seen[("trioforward_queued", ())] == 5
    assert seen[("trioforward_pool_connections", (("state", "active"),))] == 5
    assert seen[("trioforward_pool_connections", (("state", "idle"),))] == 2
    assert seen[("trioforward_pool_connections_opened_total", ())] == 7
    assert seen[("trioforward_adapter_loads_total", (("engine", ENGINE),))] == 2
    # One engine, seen by both workers: not doubled.
    assert seen[("trioforward_adapters_loaded", (("engine", ENGINE),))] == 1
    assert seen[("trioforward_engine_healthy", (("engine", ENGINE),))] == 1
    # Per tenant, by name only: counters summed, gauges summed over live workers.
    assert seen[("trioforward_tenant_served_total", (("tenant", "a"),))] == 12
    assert seen[("trioforward_tenant_rejections_total", (("tenant", "a"),))] == 2
    assert seen[("trioforward_tenant_queued", (("tenant", "a"),))] == 5
    # Each sample once in the exposition (no per-worker copy beside the sum).
    assert len([k for k in seen if k[0] == "trioforward_in_flight"]) == 1

    # Counters advance by what is new, never twice.
    clients["w2"] = _client(requests=9, in_flight=0, queued=0, active=0, retries=2)
    as_worker("w2").sync()
    as_worker("w2").sync()
    seen = _samples(as_worker("w1"))
    assert seen[("trioforward_dispatch_requests_total", ())] == 14
    assert seen[("trioforward_in_flight", ())] == 2

    # A dead worker (the supervisor marks it): its counts stay, its gauges go.
    clients["w2"] = _client(requests=9, in_flight=6, queued=6, active=6, retries=2)
    as_worker("w2").sync()
    multiprocess.mark_process_dead("w2", str(directory))  # type: ignore[no-untyped-call]
    seen = _samples(as_worker("w1"))
    assert seen[("trioforward_dispatch_requests_total", ())] == 14
    assert seen[("trioforward_in_flight", ())] == 2
    assert seen[("trioforward_queued", ())] == 1


def test_tinker_rejections_are_summed_over_the_box(worker_metrics: Any) -> None:
    """``trioforward_tinker_rejections_total`` under ``--workers N`` (docs/fleet.md,
    "Metrics"): each worker's refusals, summed by any worker's scrape."""
    as_worker, _, _ = worker_metrics
    as_worker("w1").rejection("/api/v1/asample", 429, "queue_full")
    as_worker("w2").rejection("/api/v1/asample", 429, "queue_full")
    as_worker("w2").rejection("/api/v1/retrieve_future", 404, "not_found")
    seen = _samples(as_worker("w1"))
    full = (("code", "queue_full"), ("route", "/api/v1/asample"), ("status", "429"))
    unknown = (("code", "not_found"), ("route", "/api/v1/retrieve_future"), ("status", "404"))
    assert seen[("trioforward_tinker_rejections_total", full)] == 2
    assert seen[("trioforward_tinker_rejections_total", unknown)] == 1
