"""A client that hangs up cancels its forward: the upstream connection is closed at
once, the engine records the abort, nothing is retried — through Hypercorn, for
streaming and non-streaming requests."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import trio
import trio.testing
from gateway_harness import generation_requests, open_gateway, open_sim


async def send_raw(url: str, body: dict[str, Any]) -> trio.SocketStream:
    parts = urlsplit(url)
    stream = await trio.open_tcp_stream(parts.hostname or "127.0.0.1", parts.port or 80)
    content = orjson.dumps(body)
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(content)
    )
    await stream.send_all(head + content)
    return stream


@pytest.mark.parametrize("stock_hypercorn", [False, True], ids=["our-worker", "stock-hypercorn"])
@pytest.mark.parametrize("streaming", [False, True], ids=["non-streaming", "streaming"])
async def test_client_disconnect_aborts_the_engine_request(
    fd_baseline: int, streaming: bool, stock_hypercorn: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="trioforward.access")
    # 1000 tokens at 50 ms each: the generation would run for 50 s. Our worker
    # cancels the forward from the connection's task (the disconnect hook);
    # stock Hypercorn has no hook, and the forwarder's watcher task does it.
    async with open_sim(decode_ms_per_token=50) as engine, open_gateway(
        engine.url, stock_hypercorn=stock_hypercorn
    ) as gw:
        body = {"model": "sim-base", "prompt": "x", "max_tokens": 1000, "stream": streaming}
        client = await send_raw(gw.url, body)
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.running == 1)
            if streaming:  # the response has started: headers and a first event arrived
                first = await client.receive_some(65536)
                assert first.startswith(b"HTTP/1.1 200")
        await client.aclose()
        started = trio.current_time()
        with trio.fail_after(2):  # fail-safe; docs/design.md, "The gateway server": closed at once
            await engine.stats.wait_for(lambda s: s.aborted == 1)
        elapsed = trio.current_time() - started
        await trio.testing.wait_all_tasks_blocked()
        stats = gw.state.client.statistics()
        assert stats.pool.active == 0
        assert stats.in_flight == 0
        assert not stats.retries
        assert generation_requests(engine) == 1
        assert engine.stats.completed == 0
        metrics = gw.state.metrics.render().decode()
        assert 'trioforward_gateway_requests_total{route="/v1/completions",status="499"} 1.0' in metrics
        # The access line names the engine the abandoned request was on.
        lines = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
        assert len(lines) == 1 and lines[0].startswith("POST /v1/completions 499 "), lines
        assert f"engine={engine.url} attempts=1 " in lines[0], lines
        engine_time = float(lines[0].split("engine_time=")[1].split("s")[0])
        assert engine_time > 0.0, lines
    print(f"upstream aborted {1e3 * elapsed:.1f} ms after the client hung up")


async def test_a_client_that_hangs_up_while_queued_is_logged_with_its_queue_time(
    fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    # One slot, taken by a long generation: the second request waits in QUEUED,
    # and its client leaves after 0.2 s. Nothing reaches the engine for it, and
    # its access line carries the time it waited (found by a fresh-eyes pass:
    # it said queue=0.000s).
    caplog.set_level("INFO", logger="trioforward.access")
    async with open_sim(decode_ms_per_token=50) as engine, open_gateway(
        engine.url, engine_capacity=1
    ) as gw:
        running = await send_raw(gw.url, {"model": "sim-base", "prompt": "x", "max_tokens": 1000})
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.running == 1)
        queued = await send_raw(gw.url, {"model": "sim-base", "prompt": "y", "max_tokens": 2})
        await trio.testing.wait_all_tasks_blocked()
        assert gw.state.client.statistics().queued == 1
        await trio.sleep(0.2)  # the time it spends queued: what the log must show
        await queued.aclose()
        with trio.fail_after(5):
            while not (lines := [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]):
                await trio.testing.wait_all_tasks_blocked()
                await trio.lowlevel.checkpoint()
        assert lines[0].startswith("POST /v1/completions 499 engine=- attempts=0 "), lines
        assert float(lines[0].split("queue=")[1].split("s")[0]) >= 0.2, lines
        await running.aclose()
        with trio.fail_after(5):
            await engine.stats.wait_for(lambda s: s.aborted == 1)
        assert generation_requests(engine) == 1  # the queued one never reached it
        await trio.testing.wait_all_tasks_blocked()
        assert gw.state.client.statistics().queued == 0
