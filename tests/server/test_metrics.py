"""``/metrics``: Prometheus text that prometheus-client's parser reads, and counters that move."""

from __future__ import annotations

from typing import Any

import httpx
from gateway_harness import Gateway
from prometheus_client.parser import text_string_to_metric_families


async def scrape(client: httpx.AsyncClient, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get(url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def test_counters_move(engine: Any, gateway: Gateway) -> None:
    body = {"model": "sim-base", "prompt": "x", "max_tokens": 2}
    async with httpx.AsyncClient() as client:
        before = await scrape(client, gateway.url)
        for _ in range(3):
            assert (await client.post(gateway.url + "/v1/completions", json=body)).status_code == 200
        assert (await client.post(gateway.url + "/v1/completions", json={"prompt": "x"})).status_code == 400
        after = await scrape(client, gateway.url)
    ok = ("trioforward_gateway_requests_total", (("route", "/v1/completions"), ("status", "200")))
    bad = ("trioforward_gateway_requests_total", (("route", "/v1/completions"), ("status", "400")))
    assert after[ok] - before.get(ok, 0) == 3
    assert after[bad] == 1
    engine_ok = ("trioforward_engine_responses_total", (("engine", engine.url), ("status", "200")))
    assert after[engine_ok] - before.get(engine_ok, 0) == 3
    assert after[("trioforward_queue_wait_seconds_count", ())] == 3
    assert after[("trioforward_engine_time_seconds_count", ())] == 3
    assert after[("trioforward_engine_time_seconds_sum", ())] > 0
    assert after[("trioforward_in_flight", ())] == 0
    assert after[("trioforward_queued", ())] == 0
    assert after[("trioforward_pool_connections", (("state", "active"),))] == 0
    assert after[("trioforward_pool_connections", (("state", "idle"),))] >= 1
    assert after[("trioforward_pool_connections_opened_total", ())] >= 1
    assert after[("trioforward_engine_healthy", (("engine", engine.url),))] == 1
    assert after[("trioforward_dispatch_requests_total", ())] >= 3


async def test_no_created_series(engine: Any, gateway: Gateway) -> None:
    """prometheus-client's ``*_created`` samples are not served (docs/server.md,
    "Metrics (`GET /metrics`)"); the counters and histograms they belong to are."""
    body = {"model": "sim-base", "prompt": "x", "max_tokens": 2}
    async with httpx.AsyncClient() as client:
        assert (await client.post(gateway.url + "/v1/completions", json=body)).status_code == 200
        samples = await scrape(client, gateway.url)
    names = {name for name, _ in samples}
    assert {"trioforward_gateway_requests_total", "trioforward_queue_wait_seconds_count",
            "trioforward_engine_time_seconds_count"} <= names
    assert not [name for name in names if name.endswith("_created")]
