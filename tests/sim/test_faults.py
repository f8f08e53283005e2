"""Each fault, switched at run time, and the counters that prove it happened."""

from __future__ import annotations

import math

import h11
import orjson
import pytest
import trio
from simclient import Conn, request

from trioforward.sim import SimEngine, open_engine

COMPLETE = {"prompt": [1, 2], "max_tokens": 3}


async def test_refuse_connections_resets(engine: SimEngine) -> None:
    engine.faults.refuse_connections = True
    # the RST may beat the end of connect() or arrive on the first read
    with pytest.raises((OSError, trio.BrokenResourceError)):
        async with await Conn.open(engine) as conn:
            await conn.send("GET", "/health")
            await conn.stream.receive_some(10)
    await engine.stats.wait_for(lambda s: s.connections_reset == 1)
    engine.faults.refuse_connections = False
    assert (await request(engine, "GET", "/health")).status == 200
    assert engine.stats.connections_accepted == 1 and engine.stats.faults["refuse_connections"] == 1


async def test_stop_and_start_listening_on_the_same_port(engine: SimEngine) -> None:
    port = engine.port
    conn = await Conn.open(engine)
    assert (await conn.request("GET", "/health")).status == 200
    await engine.stop_listening()
    assert not engine.listening
    assert await conn.at_eof()  # open connections die with the listener
    await conn.aclose()
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", port)
    await engine.start_listening()
    assert engine.port == port and engine.listening
    assert (await request(engine, "GET", "/health")).status == 200


async def test_new_engine_can_rebind_a_released_port(fd_baseline: int) -> None:
    async with open_engine() as first:
        port = first.port
        await request(first, "GET", "/health")
    async with open_engine(port=port) as second:
        assert (await request(second, "GET", "/health")).status == 200


async def test_pause_accept_leaves_connections_in_the_backlog(
    engine: SimEngine, autojump_clock: trio.abc.Clock
) -> None:
    engine.faults.pause_accept = True
    async with await Conn.open(engine) as conn:  # the kernel completes the handshake
        await conn.send("GET", "/health")
        with trio.move_on_after(3600):  # virtual time: nothing may arrive
            await conn.stream.receive_some(10)
            pytest.fail("answered while accept() is paused")
        assert engine.stats.connections_accepted == 0
        engine.faults.pause_accept = False
        assert (await conn.response()).status == 200
    assert engine.stats.connections_accepted == 1


async def test_drop_closes_after_reading_the_request(engine: SimEngine) -> None:
    engine.faults.drop = 1
    async with await Conn.open(engine) as conn:
        await conn.send("POST", "/v1/completions", COMPLETE)
        assert await conn.at_eof()
    assert (await request(engine, "GET", "/health")).status == 200  # not a fault path
    assert (await request(engine, "POST", "/v1/completions", COMPLETE)).status == 200
    s = engine.stats
    assert (
        s.requests == 3 and s.faults["drop"] == 1 and s.completed == 1 and engine.faults.drop == 0
    )


@pytest.mark.parametrize(("status", "retry_after"), [(503, 1.5), (429, None)])
async def test_reject_next_k(engine: SimEngine, status: int, retry_after: float | None) -> None:
    engine.faults.reject = 2
    engine.faults.reject_status = status
    engine.faults.retry_after = retry_after
    async with await Conn.open(engine) as conn:
        for _ in range(2):
            reply = await conn.request("POST", "/v1/completions", COMPLETE)
            assert reply.status == status and reply.json()["error"]["code"] == status
            assert reply.headers.get("retry-after") == (None if retry_after is None else "1.5")
        assert (await conn.request("POST", "/v1/completions", COMPLETE)).status == 200
    assert (
        engine.stats.rejected == 2
        and engine.stats.responses[status] == 2
        and engine.stats.completed == 1
    )


async def test_connection_close_on_every_response(engine: SimEngine) -> None:
    engine.faults.connection_close = True
    async with await Conn.open(engine) as conn:
        reply = await conn.request("GET", "/health")
        assert reply.status == 200 and reply.headers["connection"] == "close"
        assert await conn.at_eof()


async def test_close_every_nth_response_without_warning(engine: SimEngine) -> None:
    engine.faults.close_every = 2
    async with await Conn.open(engine) as conn:
        for _ in range(2):
            reply = await conn.request("POST", "/v1/completions", COMPLETE)
            assert reply.status == 200 and "connection" not in reply.headers
        assert await conn.at_eof()
    assert engine.stats.faults["close_every"] == 1


async def test_health_can_fail(engine: SimEngine) -> None:
    engine.faults.health_status = 503
    assert (await request(engine, "GET", "/health")).status == 503
    engine.faults.clear()
    assert (await request(engine, "GET", "/health")).status == 200


async def test_stall_headers_then_client_leaves_is_aborted(engine: SimEngine) -> None:
    engine.faults.stall_headers = 1
    async with await Conn.open(engine) as conn:
        await conn.send("POST", "/v1/completions", COMPLETE)
        head = await conn.head()
        assert head.status_code == 200
    with trio.fail_after(10):
        await engine.stats.wait_for(lambda s: s.aborted == 1 and s.connections_open == 0)
    assert engine.stats.completed == 0 and engine.stats.faults["stall_headers"] == 1


async def test_stall_body_sends_half_then_resumes(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(keep_alive=60) as engine:
        body = {**COMPLETE, "seed": 1}
        expected = (await request(engine, "POST", "/v1/completions", body)).body
        engine.faults.stall_body = 1
        engine.faults.stall_seconds = 30.0
        async with await Conn.open(engine) as conn:
            start = trio.current_time()
            await conn.send("POST", "/v1/completions", body)
            reply = await conn.response()
            assert trio.current_time() - start == pytest.approx(30.0)
        assert reply.status == 200 and reply.json()["choices"] == orjson.loads(expected)["choices"]
        assert engine.stats.completed == 2 and engine.stats.faults["stall_body"] == 1


async def test_stall_mid_stream_then_client_leaves_is_aborted(engine: SimEngine) -> None:
    engine.faults.stall_body = 1
    async with await Conn.open(engine) as conn:
        await conn.send("POST", "/v1/completions", {**COMPLETE, "stream": True})
        assert (await conn.head()).status_code == 200
    with trio.fail_after(10):
        await engine.stats.wait_for(lambda s: s.aborted == 1)


async def test_trickle_delivers_the_same_body_slowly(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(keep_alive=60) as engine:
        plain = (await request(engine, "POST", "/v1/completions", COMPLETE)).json()
        engine.faults.trickle = 1
        engine.faults.trickle_bytes = 10
        engine.faults.trickle_interval = 1.0
        start = trio.current_time()
        trickled = (await request(engine, "POST", "/v1/completions", COMPLETE)).json()
        assert trio.current_time() - start > 10  # well over 10 writes, 1 s apart
        assert trickled["choices"] == plain["choices"]
        assert engine.stats.faults["trickle"] == 1 and engine.stats.completed == 2


async def test_client_disconnect_while_generating_is_aborted(engine: SimEngine) -> None:
    engine.prefill_stall(math.inf)
    async with await Conn.open(engine) as conn:
        await conn.send("POST", "/v1/completions", COMPLETE)
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.running == 1)
    with trio.fail_after(10):
        await engine.stats.wait_for(
            lambda s: s.aborted == 1 and s.running == 0 and s.connections_open == 0
        )
    assert engine.stats.completed == 0


async def test_client_disconnect_while_queued_is_aborted(fd_baseline: int) -> None:
    async with open_engine(capacity=1) as engine:
        engine.prefill_stall(math.inf)
        async with await Conn.open(engine) as running, await Conn.open(engine) as queued:
            await running.send("POST", "/v1/completions", COMPLETE)
            await queued.send("POST", "/v1/completions", COMPLETE)
            with trio.fail_after(10):
                await engine.stats.wait_for(lambda s: s.running == 1 and s.queued == 1)
            await queued.aclose()
            with trio.fail_after(10):
                await engine.stats.wait_for(lambda s: s.aborted == 1 and s.queued == 0)
            engine.end_stall()
            assert (await running.response()).status == 200
        assert engine.stats.completed == 1 and engine.stats.peak_running == 1


async def test_pipelined_request_during_generation_is_served(fd_baseline: int) -> None:
    async with open_engine(capacity=1) as engine:
        engine.prefill_stall(math.inf)
        async with await Conn.open(engine) as conn:
            await conn.send("POST", "/v1/completions", COMPLETE)
            with trio.fail_after(10):
                await engine.stats.wait_for(lambda s: s.running == 1)
            # a second request on the same connection before the first answer
            raw = h11.Connection(h11.CLIENT)
            data = raw.send(h11.Request(method="GET", target="/health", headers=[("host", "x")]))
            data = (data or b"") + (raw.send(h11.EndOfMessage()) or b"")
            await conn.stream.send_all(data)
            engine.end_stall()
            assert (await conn.response()).status == 200
            conn.h11.send(h11.Request(method="GET", target="/health", headers=[("host", "x")]))
            conn.h11.send(h11.EndOfMessage())
            assert (await conn.response()).status == 200
        assert engine.stats.by_path["/health"] == 1 and engine.stats.aborted == 0


async def test_keep_alive_idle_timeout_closes(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(keep_alive=5.0) as engine:
        async with await Conn.open(engine) as conn:
            assert (await conn.request("GET", "/health")).status == 200
            start = trio.current_time()
            assert await conn.at_eof()
            assert trio.current_time() - start == pytest.approx(5.0)
        assert engine.stats.keep_alive_closed == 1


async def test_faults_only_hit_their_paths(engine: SimEngine) -> None:
    engine.faults.update({"drop": 1, "paths": ["/v1/chat/completions"]})
    assert (await request(engine, "POST", "/v1/completions", COMPLETE)).status == 200
    async with await Conn.open(engine) as conn:
        await conn.send(
            "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}
        )
        assert await conn.at_eof()
    assert engine.stats.faults["drop"] == 1


async def test_malformed_http_gets_400_and_close(engine: SimEngine) -> None:
    async with await Conn.open(engine) as conn:
        await conn.stream.send_all(b"NOT HTTP\r\n\r\n")
        data = b""
        while chunk := await conn.stream.receive_some(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400")
