"""Hypercorn settings, long streams, and SIGTERM drain of a ``trioforward serve`` process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from gateway_harness import generation_requests, open_gateway, open_sim, reap, start_serve

from trioforward._settings import Settings
from trioforward.server import create_app, hypercorn_config
from trioforward.server.app._serve import somaxconn


def test_hypercorn_and_quart_settings_for_bursts_and_long_generations() -> None:
    settings = Settings()
    config = hypercorn_config(settings)
    assert config.backlog == min(4096, somaxconn())
    assert config.keep_alive_timeout == 75.0
    assert config.graceful_timeout == settings.shutdown_grace
    assert config.read_timeout is None
    app = create_app(settings)
    assert app.config["RESPONSE_TIMEOUT"] is None
    assert app.config["BODY_TIMEOUT"] is None
    assert app.config["MAX_CONTENT_LENGTH"] == 64 * 1024 * 1024
    config = hypercorn_config(settings.replace(backlog=10**6, host="::1", port=9))
    assert config.backlog == somaxconn()
    assert config.bind == ["[::1]:9"]


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    # Jumps only when every task has been blocked for 20 ms of real time, so loopback
    # I/O always completes first; sleeps (the trickling engine) cost no real time.
    return trio.testing.MockClock(autojump_threshold=0.02)


async def test_a_long_stream_arrives_whole(autojump_clock: trio.testing.MockClock, fd_baseline: int) -> None:
    async with open_sim() as engine, open_gateway(engine.url) as gw:
        engine.faults.trickle = 1
        engine.faults.trickle_bytes = 96
        engine.faults.trickle_interval = 1.0
        body = {"model": "sim-base", "prompt": "x", "max_tokens": 48, "stream": True}
        started = trio.current_time()
        async with httpx.AsyncClient(timeout=None) as client:
            async with client.stream("POST", gw.url + "/v1/completions", json=body) as response:
                assert response.status_code == 200
                raw = b"".join([chunk async for chunk in response.aiter_bytes()])
        lasted = trio.current_time() - started
        with trio.fail_after(5):
            await engine.stats.wait_for(lambda s: s.completed == 1)
        assert await gw.pool_active() == 0
    assert lasted > 70.0, f"stream lasted only {lasted:.1f} s of engine time; make it trickle longer"
    assert raw.rstrip().endswith(b"data: [DONE]")


async def _drain_log(proc: trio.Process, log: bytearray) -> None:
    assert proc.stderr is not None
    while chunk := await proc.stderr.receive_some():
        log += chunk


async def test_sigterm_lets_in_flight_requests_finish_then_exits_0(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=20) as engine:
        proc, url, log = await start_serve(engine.url, "--shutdown-grace", "30")
        try:
            await _sigterm_case(engine, proc, url, log)
        finally:
            await reap(proc)


async def _sigterm_case(engine: Any, proc: trio.Process, url: str, log: bytearray) -> None:
    results: list[httpx.Response] = []

    async def request() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"model": "sim-base", "prompt": "x", "max_tokens": 40}
            results.append(await client.post(url + "/v1/completions", json=body))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain_log, proc, log)
        nursery.start_soon(request)
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.running == 1)
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            code = await proc.wait()
            await engine.stats.wait_for(lambda s: s.completed >= 1)
    # The drained request ran to its end on the engine: finished, not aborted.
    assert (engine.stats.completed, engine.stats.aborted) == (1, 0)
    assert code == 0, log.decode()
    assert [r.status_code for r in results] == [200]
    assert len(results[0].json()["choices"][0]["text"]) > 0
    assert generation_requests(engine) == 1
    assert b"SIGTERM received" in log


async def test_shutdown_grace_expiry_closes_the_rest_and_aborts_upstream(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=50) as engine:
        proc, url, log = await start_serve(engine.url, "--shutdown-grace", "0.3")
        try:
            await _grace_case(engine, proc, url, log)
        finally:
            await reap(proc)


async def _grace_case(engine: Any, proc: trio.Process, url: str, log: bytearray) -> None:
    failures: list[BaseException] = []

    async def request() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"model": "sim-base", "prompt": "x", "max_tokens": 1000}
            try:
                await client.post(url + "/v1/completions", json=body)
            except httpx.HTTPError as exc:
                failures.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain_log, proc, log)
        nursery.start_soon(request)
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.running == 1)
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            code = await proc.wait()
            await engine.stats.wait_for(lambda s: s.aborted == 1)
    assert code == 0, log.decode()
    assert len(failures) == 1
    assert generation_requests(engine) == 1




async def test_startup_log_counts_registered_engines_not_spellings(
    engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="trioforward.server")
    async with open_gateway(engine.url, engine.url + "/", "HTTP" + engine.url[4:]):
        pass
    started = [r.getMessage() for r in caplog.records if "gateway serving" in r.getMessage()]
    assert started == ["gateway serving 1 engine(s)"]


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one process", "workers"])
def test_serve_on_a_taken_port_exits_1_saying_so_before_starting(workers: list[str]) -> None:
    """One line naming the address, with or without --workers (docs/server.md,
    "Starting it"), and the gateway does not start its dispatch core first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-c", "from trioforward.cli import main; main()", "serve",
             "--engine", "http://127.0.0.1:9", *workers, "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in out.stderr, out.stderr
    assert "gateway serving" not in out.stderr and "Traceback" not in out.stderr, out.stderr


async def test_startup_without_engines_warns_that_every_request_will_be_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="trioforward.server")
    async with open_gateway():
        pass
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(m.startswith("no engine registered: every request answers 503") for m in warnings)
