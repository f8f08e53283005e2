"""Engine headers a client acts on are passed on, and the gateway's own 429/503
carry a ``Retry-After`` computed from what it knows (docs/server.md, "Headers
passed on")."""

from __future__ import annotations

from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from gateway_harness import generation_requests, open_gateway, open_sim

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 4}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_engine_429_comes_back_with_its_retry_after(stream: bool, fd_baseline: int) -> None:
    async with open_sim() as engine, open_gateway(engine.url, backoff_max=0.2) as gw:
        engine.faults.update({"reject": 2, "reject_status": 429, "retry_after": 2})
        async with httpx.AsyncClient(base_url=gw.url) as client:
            with trio.fail_after(20):
                response = await client.post("/v1/completions", json={**BODY, "stream": stream})
        assert response.status_code == 429
        assert response.headers["retry-after"] == "2"
        assert "error" in response.json()  # the engine's body, verbatim
        assert generation_requests(engine) == 2  # retried once, as the rules say
        assert await gw.pool_active() == 0


def test_only_end_to_end_fields_a_client_acts_on_are_passed_on() -> None:
    from trioforward.server.base._errors import passed_on

    engine_headers = [
        (b"content-type", b"application/json"),
        (b"retry-after", b"7"),
        (b"x-request-id", b"abc"),
        (b"content-encoding", b"gzip"),
        (b"set-cookie", b"session=1"),
        (b"www-authenticate", b"Bearer"),
        (b"connection", b"close"),
        (b"keep-alive", b"timeout=5"),
        (b"transfer-encoding", b"chunked"),
        (b"server", b"uvicorn"),
        (b"date", b"Mon, 30 Nov 2026 00:00:00 GMT"),
    ]
    assert passed_on(engine_headers) == (
        (b"retry-after", b"7"),
        (b"content-encoding", b"gzip"),
    )
    assert passed_on([(b"content-type", b"application/json")]) == ()


def _retry_after(response: httpx.Response) -> int:
    value = int(response.headers["retry-after"])
    assert 1 <= value <= 600
    return value


async def test_gateway_429_queue_full_has_retry_after(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=100) as engine, open_gateway(
        engine.url, max_outstanding=1
    ) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(client.post, "/v1/completions", json={**BODY, "max_tokens": 10}))
                await engine.stats.wait_for(lambda s: s.running == 1)
                response = await client.post("/v1/completions", json=BODY)
        assert response.status_code == 429 and response.json()["error"]["code"] == "queue_full"
        _retry_after(response)


async def test_gateway_503_queue_timeout_has_retry_after(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=100) as engine, open_gateway(
        engine.url, engine_capacity=1, queue_timeout=0.2
    ) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
            # One finished request teaches the gateway how long a request takes.
            assert (await client.post("/v1/completions", json=BODY)).status_code == 200
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(client.post, "/v1/completions", json={**BODY, "max_tokens": 30}))
                await engine.stats.wait_for(lambda s: s.running == 1)
                response = await client.post("/v1/completions", json=BODY)
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "queue_timeout"
        assert _retry_after(response) == 1  # ~0.4 s per request ahead, one ahead


async def test_gateway_503_paused_past_queue_timeout_has_retry_after(fd_baseline: int) -> None:
    async with open_sim() as engine, open_gateway(engine.url, queue_timeout=0.3) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
            assert (await client.post("/admin/pause", json={})).status_code == 200
            response = await client.post("/v1/completions", json=BODY)
            assert (await client.post("/admin/resume", json={})).status_code == 200
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "no_engine_available"
        _retry_after(response)


async def test_gateway_503_no_engine_has_retry_after(fd_baseline: int) -> None:
    async with open_gateway() as gw, httpx.AsyncClient(base_url=gw.url) as client:
        response = await client.post("/v1/completions", json=BODY)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_engine_available"
    assert _retry_after(response) == 1


async def test_gateway_503_no_healthy_engine_waits_for_the_probes(fd_baseline: int) -> None:
    async with open_sim() as engine, open_gateway(
        engine.url, health_interval=2.5, health_failures=1, health_successes=2,
        unhealthy_timeout=0.1, connect_retries=0,
    ) as gw:
        await engine.stop_listening()
        async with httpx.AsyncClient(base_url=gw.url) as client:
            first = await client.post("/v1/completions", json=BODY)
            assert first.status_code == 502  # the connect failure ejects the engine
            response = await client.post("/v1/completions", json=BODY)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_engine_available"
    assert _retry_after(response) == 5  # two probes 2.5 s apart re-admit it


async def test_gateway_503_aborted_by_pause_has_retry_after(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=100) as engine, open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
            responses: list[Any] = []

            async def call() -> None:
                responses.append(await client.post("/v1/completions", json={**BODY, "max_tokens": 30}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await engine.stats.wait_for(lambda s: s.running == 1)
                await client.post("/admin/pause", json={"mode": "abort"})
            await client.post("/admin/resume", json={})
        [response] = responses
        assert response.status_code == 503 and response.json()["error"]["code"] == "aborted"
        _retry_after(response)
