"""Keep-alive timeout of the gateway's Hypercorn worker (``_tcpserver.KeepAliveTCPServer``):
idle connections close after ``keep_alive`` seconds, busy ones never, and all idle
ones at once when shutdown starts."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from asgi_harness import answer_lifespan, serve_asgi

from trioforward._settings import Settings

REQUEST = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    # Jumps only when every task has been blocked for 20 ms of real time, so
    # loopback I/O completes first; the keep-alive timeout costs no real time.
    return trio.testing.MockClock(autojump_threshold=0.02)


def _app(delay: float) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        await receive()
        await trio.sleep(delay)
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def _server(delay: float = 0.0, keep_alive: float = 5.0) -> Any:
    return serve_asgi(_app(delay), Settings(keep_alive=keep_alive, shutdown_grace=30.0))


async def _response(stream: trio.SocketStream) -> bytes:
    data = b""
    while not data.endswith(b"ok"):
        chunk = await stream.receive_some()
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data


async def _wait_closed(stream: trio.SocketStream) -> None:
    while await stream.receive_some():
        pass


async def test_idle_connection_closes_after_keep_alive(
    autojump_clock: trio.testing.MockClock, fd_baseline: int
) -> None:
    async with _server() as (port, _stop):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(REQUEST)
            assert (await _response(stream)).startswith(b"HTTP/1.1 200")
            await stream.send_all(REQUEST)  # still open: reused
            assert (await _response(stream)).startswith(b"HTTP/1.1 200")
            idle_from = trio.current_time()
            with trio.fail_after(60):
                await _wait_closed(stream)
            assert 5.0 <= trio.current_time() - idle_from < 60
        async with await trio.open_tcp_stream("127.0.0.1", port) as silent:
            started = trio.current_time()
            with trio.fail_after(60):
                await _wait_closed(silent)  # never sent anything: idle from the start
            assert trio.current_time() - started >= 5.0


async def test_busy_connection_outlives_keep_alive(
    autojump_clock: trio.testing.MockClock, fd_baseline: int
) -> None:
    async with _server(delay=20.0) as (port, _stop):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(REQUEST)
            with trio.fail_after(60):
                assert (await _response(stream)).startswith(b"HTTP/1.1 200")


async def test_shutdown_closes_idle_connections_at_once(
    autojump_clock: trio.testing.MockClock, fd_baseline: int
) -> None:
    async with _server(keep_alive=75.0) as (port, stop):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(REQUEST)
            assert (await _response(stream)).startswith(b"HTTP/1.1 200")
            started = trio.current_time()
            stop.set()
            with trio.fail_after(60):
                await _wait_closed(stream)
            assert trio.current_time() - started < 5.0
