"""Readiness tells the truth (docs/server.md, "Admin API"): liveness vs readiness, every
route 503 JSON before the app is ready, and an ejection without probes is temporary."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from gateway_harness import generation_requests, open_gateway, open_sim

from trioforward import Settings
from trioforward.server import create_app

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 2}


async def test_no_engine_is_not_ready_but_alive(fd_baseline: int) -> None:
    async with open_gateway() as gw, httpx.AsyncClient(base_url=gw.url) as client:
        for path in ("/health", "/readyz"):
            response = await client.get(path)
            assert response.status_code == 503, path
            assert response.json()["status"] == "no_engines"
        live = await client.get("/livez")
        assert live.status_code == 200 and live.json()["status"] == "alive"
        # ... and indeed nothing can be served:
        assert (await client.post("/v1/completions", json=BODY)).status_code == 503


async def test_ready_with_a_healthy_engine_paused_or_not(engine: Any, fd_baseline: int) -> None:
    async with open_gateway(engine.url) as gw, httpx.AsyncClient(base_url=gw.url) as client:
        assert (await client.get("/readyz")).status_code == 200
        await client.post("/admin/pause", json={})
        ready = await client.get("/readyz")  # requests wait for resume: still served
        assert ready.status_code == 200 and ready.json()["dispatchable_engines"] == 0
        await client.post("/admin/resume", json={})


async def test_every_route_answers_503_json_before_startup(fd_baseline: int) -> None:
    app = create_app(Settings(engines=("http://127.0.0.1:9",)))
    transport = httpx.ASGITransport(app=app)  # no lifespan: the app never started
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        for method, path in [
            ("GET", "/admin/engines"),
            ("POST", "/admin/engines"),
            ("GET", "/admin/adapters"),
            ("GET", "/v1/models"),
            ("GET", "/metrics"),
            ("POST", "/v1/completions"),
            ("POST", "/api/v1/asample"),
            ("POST", "/api/v1/get_server_capabilities"),
            ("POST", "/api/v1/create_sampling_session"),
        ]:
            response = await client.request(method, path, json={})
            assert response.status_code == 503, (method, path, response.text)
            assert response.json()["error"]["code"] == "not_ready", (method, path)
            assert response.headers["retry-after"] == "1"
        for path in ("/health", "/readyz", "/livez"):
            response = await client.get(path)
            assert response.status_code == 503 and response.json()["status"] == "starting"


async def test_ejection_without_probes_is_temporary(fd_baseline: int) -> None:
    async with open_sim() as engine, open_gateway(
        engine.url, health_interval=0, health_failures=1, connect_retries=0,
        unhealthy_timeout=30,
    ) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
            await engine.stop_listening()
            assert (await client.post("/v1/completions", json=BODY)).status_code == 502
            assert not gw.state.client.engines.list()[0].healthy  # ejected
            await engine.start_listening()
            with trio.fail_after(20):  # the first re-admission comes after 1 s
                response = await client.post("/v1/completions", json=BODY)
            assert response.status_code == 200
            assert gw.state.client.engines.list()[0].healthy
        assert generation_requests(engine) == 1


async def test_a_failed_trial_ejects_again_with_a_longer_back_off(fd_baseline: int) -> None:
    async with open_sim() as engine, open_gateway(
        engine.url, health_interval=0, health_failures=2, connect_retries=0,
        unhealthy_timeout=30,
    ) as gw:
        registry = gw.state.client._registry
        info = gw.state.client.engines.list
        await engine.stop_listening()
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
            for _ in range(2):
                assert (await client.post("/v1/completions", json=BODY)).status_code == 502
            assert not info()[0].healthy
            with trio.fail_after(20):
                while not info()[0].healthy:  # re-admitted on trial after 1 s
                    await registry.wait_changed()
            # One failure on trial is enough to eject it again.
            assert (await client.post("/v1/completions", json=BODY)).status_code == 502
            assert not info()[0].healthy
            assert registry.by_url[engine.url].ejections == 2  # next back-off: 2 s


@pytest.mark.parametrize("url", ["", "x"])
async def test_admin_engine_url_errors_say_what_is_wrong(url: str, engine: Any) -> None:
    async with open_gateway(engine.url) as gw, httpx.AsyncClient(base_url=gw.url) as client:
        response = await client.post("/admin/engines", json={"url": url})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith("engine URL ") and "setting" not in message
