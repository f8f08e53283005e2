"""Control calls never wait behind generations or a pause (docs/semantics.md,
"Which path each engine call takes"): the Tinker capabilities and ``GET /v1/models``
answer while the gateway is paused and while the engine's capacity is taken."""

from __future__ import annotations

from functools import partial

import httpx
import pytest
import trio
from gateway_harness import generation_requests, open_gateway, open_sim

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 400}
CONTROL = [
    ("POST", "/api/v1/get_server_capabilities", "supported_models", "model_name"),
    ("GET", "/api/v1/get_server_capabilities", "supported_models", "model_name"),
    ("GET", "/v1/models", "data", "id"),
]


async def _ask(client: httpx.AsyncClient, method: str, path: str, key: str, name: str) -> None:
    # A hang guard only: the generation below takes 20 s (400 tokens at 50 ms) and
    # the pause never ends; what is asserted is that the answer came meanwhile.
    with trio.fail_after(10):
        response = await client.request(method, path, json={} if method == "POST" else None)
    assert response.status_code == 200
    assert "sim-base" in [m[name] for m in response.json()[key]]


@pytest.mark.parametrize(("method", "path", "key", "name"), CONTROL)
async def test_answered_while_paused(
    method: str, path: str, key: str, name: str, fd_baseline: int
) -> None:
    async with open_sim() as engine, open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            assert (await client.post("/admin/pause", json={})).status_code == 200
            await _ask(client, method, path, key, name)
            assert (await client.post("/admin/resume", json={})).status_code == 200
        assert generation_requests(engine) == 0
        assert engine.stats.by_path["/v1/models"] == 1  # asked the engine, at once


@pytest.mark.parametrize(("method", "path", "key", "name"), CONTROL)
async def test_answered_while_capacity_is_taken(
    method: str, path: str, key: str, name: str, fd_baseline: int
) -> None:
    async with open_sim(decode_ms_per_token=50) as engine, open_gateway(
        engine.url, engine_capacity=1
    ) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(client.post, "/v1/completions", json=BODY))
                await engine.stats.wait_for(lambda s: s.running == 1)
                await _ask(client, method, path, key, name)
                assert engine.stats.running == 1  # the generation is still going
                assert gw.state.client.engines.list()[0].in_flight == 1
                nursery.cancel_scope.cancel()
        assert generation_requests(engine) == 1
        assert await gw.pool_active() == 0


async def test_an_engine_that_does_not_answer_is_left_out_in_time(fd_baseline: int) -> None:
    async with open_sim() as engine, open_sim() as silent, open_gateway(
        engine.url, silent.url, health_timeout=0.5, health_interval=0
    ) as gw:
        silent.faults.update({"pause_accept": True})
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            await _ask(client, "GET", "/v1/models", "data", "id")


