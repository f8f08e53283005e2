"""``Server-Timing`` on every proxied answer (docs/server.md, "Server-Timing"):
whole answers, stream heads, the engine's own error answers and the gateway's."""

from __future__ import annotations

from typing import Any

import httpx
import trio
import trio.testing
from gateway_harness import Gateway, open_gateway, open_sim

BODY = {"model": "sim-base", "prompt": "hi", "max_tokens": 4}


def timing(response: httpx.Response) -> dict[str, float]:
    """The ``Server-Timing`` header as ``{metric: dur}`` (ms), every metric with a dur."""
    out = {}
    for entry in response.headers["server-timing"].split(","):
        name, _, param = entry.strip().partition(";")
        key, _, value = param.partition("=")
        assert key == "dur", entry
        out[name] = float(value)
    return out


async def test_a_whole_answer_says_queue_engine_and_gateway_time(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(gateway.url + "/v1/completions", json=BODY)
    assert response.status_code == 200
    parts = timing(response)
    assert list(parts) == ["queue", "engine", "gateway"]
    assert all(v >= 0 for v in parts.values())
    assert parts["engine"] > 0  # an engine answered over loopback: never 0.000 ms


async def test_a_stream_head_carries_what_is_known_at_its_start(engine: Any, gateway: Gateway) -> None:
    body = {**BODY, "stream": True}
    async with httpx.AsyncClient() as client:
        async with client.stream("POST", gateway.url + "/v1/completions", json=body) as response:
            parts = timing(response)
            raw = await response.aread()
    assert response.status_code == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert list(parts) == ["queue", "engine", "gateway"] and parts["engine"] > 0


async def test_queue_time_is_the_wait_for_capacity(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(
        engine.url, engine_capacity=1
    ) as gw, httpx.AsyncClient() as client:
        answers: dict[str, httpx.Response] = {}

        async def post(name: str, max_tokens: int) -> None:
            answers[name] = await client.post(gw.url + "/v1/completions", json={**BODY, "max_tokens": max_tokens})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "first", 20)
            with trio.fail_after(10):
                await engine.stats.wait_for(lambda s: s.running == 1)
            nursery.start_soon(post, "second", 2)
            with trio.fail_after(10):
                while gw.state.client.statistics().queued < 1:
                    await trio.testing.wait_all_tasks_blocked()
                    await trio.lowlevel.checkpoint()
        first, second = timing(answers["first"]), timing(answers["second"])
        # The second waited in QUEUED for the first to finish; the first did not wait.
        assert first["queue"] == 0.0 and second["queue"] > 0
        assert engine.stats.completed == 2 and engine.stats.peak_running == 1


async def test_an_engine_error_answer_and_a_gateway_error_carry_it(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient() as client:
        unknown = await client.post(gateway.url + "/v1/completions", json={**BODY, "model": "nope"})
        assert unknown.status_code == 404  # the engine's own answer, passed on
        assert timing(unknown)["engine"] > 0
        engine.faults.reject = 2  # 503 twice: one retry (rejection_retries), then the engine's 503
        rejected = await client.post(gateway.url + "/v1/completions", json=BODY)
    assert rejected.status_code == 503
    assert set(timing(rejected)) == {"queue", "engine", "gateway"}
    assert engine.stats.rejected == 2


async def test_a_gateway_made_error_carries_it(fd_baseline: int) -> None:
    async with open_sim() as engine:
        url = engine.url
    # The engine is gone: connect retries, then the gateway's own 502.
    async with open_gateway(url, connect_retries=1, backoff_initial=0.0, health_interval=0) as gw:
        async with httpx.AsyncClient() as client:
            response = await client.post(gw.url + "/v1/completions", json=BODY)
    assert response.status_code == 502
    assert response.json()["error"]["attempts"] == 2
    assert set(timing(response)) == {"queue", "engine", "gateway"}
