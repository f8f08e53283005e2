"""Tenants on the gateway: the API key names the tenant, per-tenant limits answer
429 ``tenant_queue_full`` with Retry-After, keys never leave the gateway
(docs/dispatch.md, "Tenants and fair queueing"; docs/server.md, "Authentication")."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from gateway_harness import generation_requests, open_gateway
from test_metrics import scrape

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 2}
KEYS = {"a": "sk-tenant-a-0123456789", "b": "sk-tenant-b-9876543210", "bare": "sk-bare-key-5555"}
TENANTS = {"a": {"keys": [KEYS["a"]], "max_outstanding": 2}, "b": {"keys": [KEYS["b"]], "weight": 2}}


async def until(predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds, re-checked whenever every task is blocked."""
    with trio.fail_after(30):  # a hang guard only
        while not predicate():
            await trio.testing.wait_all_tasks_blocked(0.01)
            await trio.lowlevel.checkpoint()


def _auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


async def test_a_tenant_over_its_limit_gets_429_while_others_are_served(engine: Any) -> None:
    async with open_gateway(engine.url, tenants=TENANTS, engine_capacity=4) as gw:
        client = gw.state.client
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            engine.prefill_stall(math.inf)  # what is dispatched stays in flight
            answers: list[httpx.Response] = []

            async def post(tenant: str) -> None:
                answers.append(await http.post("/v1/completions", json=BODY, headers=_auth(tenant)))

            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(post, "a")
                await until(lambda: client.statistics().tenants["a"].outstanding == 2)
                full = await http.post("/v1/completions", json=BODY, headers=_auth("a"))
                nursery.start_soon(post, "b")
                await until(lambda: client.statistics().in_flight == 3)
                engine.end_stall()
            samples = await scrape(http, gw.url)
    assert full.status_code == 429
    assert full.json()["error"]["code"] == "tenant_queue_full"
    assert "'a'" in full.json()["error"]["message"]
    assert int(full.headers["retry-after"]) >= 1
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert generation_requests(engine) == 3  # the refused one never reached the engine
    assert samples[("trioforward_tenant_rejections_total", (("tenant", "a"),))] == 1
    assert samples[("trioforward_tenant_rejections_total", (("tenant", "b"),))] == 0
    assert samples[("trioforward_tenant_served_total", (("tenant", "a"),))] == 2
    assert samples[("trioforward_tenant_served_total", (("tenant", "b"),))] == 1
    assert samples[("trioforward_tenant_queue_wait_seconds_count", (("tenant", "b"),))] == 1


async def test_keys_are_never_logged_exported_or_forwarded(
    engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with open_gateway(
        engine.url, tenants=TENANTS, api_keys=(KEYS["bare"],), admin_token="adm-token-777"
    ) as gw:
        async with httpx.AsyncClient(base_url=gw.url) as http:
            for tenant in ("a", "b", "bare"):
                ok = await http.post("/v1/completions", json=BODY, headers=_auth(tenant))
                assert ok.status_code == 200
            stream = await http.post("/v1/completions", json={**BODY, "stream": True}, headers=_auth("b"))
            assert stream.status_code == 200
            wrong = await http.post("/v1/completions", json=BODY, headers={"Authorization": "Bearer sk-nope-1"})
            assert wrong.status_code == 401
            admin = await http.post(
                "/admin/pause", json={"mode": "nope"}, headers={"Authorization": "Bearer adm-token-777"}
            )
            assert admin.status_code == 400  # logged by the admin log, without its token
            metrics = (await http.get("/metrics")).text
            samples = await scrape(http, gw.url)
    assert generation_requests(engine) == 4
    served = {k[1][0][1]: v for k, v in samples.items() if k[0] == "trioforward_tenant_served_total"}
    # A bare api_keys key is its own tenant, named by its place, never by the key.
    assert served == {"a": 1, "b": 2, "key-1": 1, "default": 0}
    assert "/admin/pause" in caplog.text and "/v1/completions" in caplog.text  # logs were captured
    for key in (*KEYS.values(), "sk-nope-1", "adm-token-777"):
        assert key not in metrics
        assert key not in caplog.text
    # What the engine received: no client key in any forwarded header.
    assert all(key not in repr(engine.stats.snapshot()) for key in KEYS.values())


async def test_without_keys_everything_is_the_default_tenant(engine: Any) -> None:
    async with open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url) as http:
            assert (await http.post("/v1/completions", json=BODY)).status_code == 200
            samples = await scrape(http, gw.url)
    tenants = {k[1] for k in samples if k[0] == "trioforward_tenant_served_total"}
    assert tenants == {(("tenant", "default"),)}
