"""Every failure carries its phase, the reused flag and the bytes received; cancellation
and timeouts close the connection, return the slot and leak no descriptor."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing
from pool_testing import Exchange, assert_quiet, full_backlog_listener, open_server

from trioforward.http import (
    ConnectError,
    ConnectTimeout,
    Phase,
    PoolTimeout,
    RemoteProtocolError,
    open_pool,
)
from trioforward.http._connection import Connection


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _stall(ex: Exchange) -> None:
    await ex.wait_client_hangup()


# -- CONNECT ---------------------------------------------------------------------


async def test_refused_connect_is_a_connect_error(fd_baseline: int) -> None:
    port = _free_port()
    async with open_pool(max_connections=1) as pool:
        for _ in range(2):  # the slot came back: the second attempt is not queued
            with pytest.raises(ConnectError) as info:
                await pool.request("GET", f"http://127.0.0.1:{port}/")
            err = info.value
            assert type(err) is ConnectError
            assert (err.phase, err.reused, err.response_bytes) == (Phase.CONNECT, False, 0)
            assert err.origin == ("http", "127.0.0.1", port)
            # The operating system's words, not trio's nested exception reprs.
            assert err.args[0] == f"connect to 127.0.0.1:{port} failed: Connection refused"
        stats = pool.statistics()
        assert (stats.opened_total, stats.closed_total) == (0, 0)
        assert_quiet(pool)


async def test_cancel_while_connecting_frees_the_slot(fd_baseline: int) -> None:
    async with full_backlog_listener() as url, open_pool(max_connections=1) as pool:
        for _ in range(2):  # the second attempt connects too: the slot was returned
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pool.request, "GET", url + "/")
                    await trio.testing.wait_all_tasks_blocked()
                    stats = pool.statistics()
                    assert (stats.connecting, stats.waiting) == (1, 0)
                    scope.cancel()
            assert scope.cancelled_caught
            assert_quiet(pool)
        assert pool.statistics().opened_total == 0


async def test_connect_timeout_and_deadline_in_connect(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with full_backlog_listener() as url:
        async with open_pool(connect_timeout=5.0) as pool:
            start = trio.current_time()
            with pytest.raises(ConnectTimeout) as info:
                await pool.request("GET", url + "/")
            assert info.value.phase is Phase.CONNECT and "connect_timeout" in str(info.value)
            assert trio.current_time() - start == pytest.approx(5.0)
            with pytest.raises(ConnectTimeout) as info:
                await pool.request("GET", url + "/", deadline=trio.current_time() + 1.0)
            assert info.value.phase is Phase.CONNECT and "deadline" in str(info.value)
            assert_quiet(pool)


# -- SEND / AWAIT_HEADERS ------------------------------------------------------------


async def test_engine_closes_without_answering_fresh_connection(fd_baseline: int) -> None:
    async def handler(ex: Exchange) -> None:
        await ex.close()

    async with open_server(handler) as server, open_pool() as pool:
        with pytest.raises(RemoteProtocolError) as info:
            await pool.request("POST", server.url + "/", content=b"x")
        err = info.value
        assert (err.phase, err.reused, err.response_bytes) == (Phase.AWAIT_HEADERS, False, 0)
        assert len(server.requests) == 1  # the engine did receive it: not safe to retry
        assert pool.statistics().closed_total == 1
        assert_quiet(pool)


@pytest.mark.parametrize("reset", [False, True])
async def test_keep_alive_race_on_a_reused_connection(
    fd_baseline: int, monkeypatch: pytest.MonkeyPatch, reset: bool
) -> None:
    """The engine closed the idle connection just after the probe: the failure says
    reused=True and zero response bytes, what the retry rule keys on."""
    async with open_server() as server, open_pool() as pool:
        await pool.request("GET", server.url + "/")
        await server.close_idle(1, reset=reset)
        monkeypatch.setattr(Connection, "is_readable", lambda self: False)  # lose the race
        with pytest.raises(RemoteProtocolError) as info:
            await pool.request("POST", server.url + "/", content=b"x")
        err = info.value
        assert err.reused and err.response_bytes == 0
        # FIN: the write succeeds and the read sees EOF. RST: the write itself fails.
        assert err.phase is (Phase.SEND if reset else Phase.AWAIT_HEADERS)
        assert len(server.requests) == 1
        assert_quiet(pool)


async def test_partial_headers_then_close(fd_baseline: int) -> None:
    async def handler(ex: Exchange) -> None:
        await ex.send_raw(b"HTTP/1.1 200 OK\r\ncontent-len")
        await ex.close()

    async with open_server(handler) as server, open_pool() as pool:
        with pytest.raises(RemoteProtocolError) as info:
            await pool.request("GET", server.url + "/")
        assert info.value.phase is Phase.AWAIT_HEADERS
        assert info.value.response_bytes == len(b"HTTP/1.1 200 OK\r\ncontent-len")
        assert_quiet(pool)


async def test_garbage_instead_of_a_response(fd_baseline: int) -> None:
    async def handler(ex: Exchange) -> None:
        await ex.send_raw(b"SSH-2.0-OpenSSH\r\n\r\n")
        await ex.wait_client_hangup()

    async with open_server(handler) as server, open_pool() as pool:
        with pytest.raises(RemoteProtocolError) as info:
            await pool.request("GET", server.url + "/")
        assert info.value.phase is Phase.AWAIT_HEADERS and info.value.response_bytes > 0
        assert isinstance(info.value.__cause__, Exception)
        await server.wait_until(lambda: server.closed == 1)
        assert_quiet(pool)


async def test_deadline_while_awaiting_headers_closes_the_connection(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_server(_stall) as server, open_pool() as pool:
        with pytest.raises(PoolTimeout) as info:
            await pool.request("GET", server.url + "/", deadline=trio.current_time() + 30)
        err = info.value
        assert (err.phase, err.reused, err.response_bytes) == (Phase.AWAIT_HEADERS, False, 0)
        await server.wait_until(lambda: server.closed == 1)  # the engine sees the hang-up
        assert pool.statistics().closed_total == 1
        assert_quiet(pool)


# -- READ_BODY -----------------------------------------------------------------------


async def _half_body_then(ex: Exchange, then: str) -> None:
    await ex.send_raw(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)
    if then == "close":
        await ex.close()
    else:
        await ex.wait_client_hangup()


async def test_engine_breaks_off_mid_body(fd_baseline: int) -> None:
    async def handler(ex: Exchange) -> None:
        await _half_body_then(ex, "close")

    async with open_server(handler) as server, open_pool() as pool:
        with pytest.raises(RemoteProtocolError) as info:
            await pool.request("GET", server.url + "/")
        err = info.value
        assert (err.phase, err.reused) == (Phase.READ_BODY, False)
        assert err.response_bytes == len(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n") + 10
        # Same through stream(): headers arrive, the body iterator raises.
        async with pool.stream("GET", server.url + "/") as response:
            assert response.status == 200
            with pytest.raises(RemoteProtocolError) as info:
                async for _ in response.aiter_bytes():
                    pass
            assert info.value.phase is Phase.READ_BODY
        stats = pool.statistics()
        assert (stats.idle, stats.closed_total) == (0, 2)
        assert_quiet(pool)


async def test_read_timeout_is_silence_between_body_bytes(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(ex: Exchange) -> None:
        await _half_body_then(ex, "stall")

    async with open_server(handler) as server, open_pool() as pool:
        with pytest.raises(PoolTimeout) as info:
            await pool.request("GET", server.url + "/", read_timeout=2.0)
        assert info.value.phase is Phase.READ_BODY and "read_timeout" in str(info.value)
        async with pool.stream("GET", server.url + "/", read_timeout=2.0) as response:
            with pytest.raises(PoolTimeout) as info:
                await response.aread()
            assert info.value.phase is Phase.READ_BODY
        # The deadline wins when it is sooner than the read timeout.
        with pytest.raises(PoolTimeout) as info:
            await pool.request(
                "GET", server.url + "/", read_timeout=50.0, deadline=trio.current_time() + 1
            )
        assert info.value.phase is Phase.READ_BODY and "deadline" in str(info.value)
        await server.wait_until(lambda: server.closed == 3)
        assert_quiet(pool)


@pytest.mark.parametrize("how", ["request", "stream"])
async def test_cancel_while_reading_closes_and_frees_everything(fd_baseline: int, how: str) -> None:
    async def handler(ex: Exchange) -> None:
        await _half_body_then(ex, "stall")

    async with open_server(handler) as server, open_pool(max_connections=1) as pool:

        async def read() -> None:
            if how == "request":
                await pool.request("GET", server.url + "/")
            else:
                async with pool.stream("GET", server.url + "/") as response:
                    await response.aread()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await server.wait_until(lambda: len(server.requests) == 1)
            await trio.testing.wait_all_tasks_blocked()
            assert pool.statistics().active == 1
            nursery.cancel_scope.cancel()
        await server.wait_until(lambda: server.closed == 1)
        stats = pool.statistics()
        assert (stats.idle, stats.opened_total, stats.closed_total) == (0, 1, 1)
        assert_quiet(pool)


async def test_invalid_header_is_a_value_error_and_returns_the_slot(fd_baseline: int) -> None:
    async with open_server() as server, open_pool(max_connections=1) as pool:
        for _ in range(2):
            with pytest.raises(ValueError):
                await pool.request("GET", server.url + "/", headers=[(b"bad header", b"x")])
        assert (await pool.request("GET", server.url + "/")).status == 200
        assert len(server.requests) == 1
        assert_quiet(pool)
