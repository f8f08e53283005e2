"""Keep-alive reuse, idle expiry, stale-connection detection, framing and big bodies."""

from __future__ import annotations

import dataclasses
import hashlib
import random

import pytest
import trio
import trio.testing
from pool_testing import Exchange, assert_quiet, open_server

from trioforward.http import open_pool
from trioforward.http._connection import Connection


async def test_sequential_requests_reuse_one_connection(fd_baseline: int) -> None:
    async with open_server() as server, open_pool() as pool:
        responses = [
            await pool.request("POST", server.url + "/echo", content=b"hello %d" % i)
            for i in range(3)
        ]
        assert [r.content for r in responses] == [b"hello 0", b"hello 1", b"hello 2"]
        assert [r.reused for r in responses] == [False, True, True]
        assert all(r.status == 200 for r in responses)
        assert server.accepted == 1
        stats = pool.statistics()
        assert (stats.opened_total, stats.reused_total, stats.idle) == (1, 2, 1)
        assert_quiet(pool)
    assert pool.statistics().closed_total == 1


async def test_request_carries_host_length_and_caller_headers(fd_baseline: int) -> None:
    async with open_server() as server, open_pool() as pool:
        await pool.request(
            "POST", server.url + "/v1/x?q=1", headers=[("X-Session-ID", "s1")], content=b"abc"
        )
        ex = server.requests[0]
        headers = dict(ex.request.headers)
        assert ex.request.method == b"POST" and ex.request.target == b"/v1/x?q=1"
        assert headers[b"host"] == f"127.0.0.1:{server.port}".encode()
        assert headers[b"content-length"] == b"3"
        assert headers[b"x-session-id"] == b"s1"
        assert ex.body == b"abc"


async def test_newest_idle_connection_is_reused_first(fd_baseline: int) -> None:
    release = [trio.Event(), trio.Event()]

    async def handler(ex: Exchange) -> None:
        if ex.request_index == 0:
            await release[ex.connection_index].wait()
        await ex.respond(200, b"conn %d" % ex.connection_index)

    async with open_server(handler) as server, open_pool() as pool:
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(pool.request, "GET", server.url + "/")
            await server.wait_until(lambda: len(server.requests) == 2)
            release[0].set()  # connection 0 parks first ...
            await trio.testing.wait_all_tasks_blocked()
            release[1].set()  # ... connection 1 parks last: it is the newest
        response = await pool.request("GET", server.url + "/")
        assert response.content == b"conn 1" and response.reused
        assert_quiet(pool)


async def test_checkout_probes_only_the_popped_connection(
    fd_baseline: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """O(1) checkout: with 30 parked connections, one request probes exactly one."""
    gate = trio.Event()
    count = 30

    async def handler(ex: Exchange) -> None:
        if ex.request_index == 0:
            if len(ex.server.requests) == count:
                gate.set()
            await gate.wait()
        await ex.respond(200, b"ok")

    async with open_server(handler) as server, open_pool() as pool:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(pool.request, "GET", server.url + "/")
        assert pool.statistics().idle == count
        probes: list[int] = []
        original = Connection.is_readable

        def counting(self: Connection) -> bool:
            probes.append(self.fd)
            return original(self)

        monkeypatch.setattr(Connection, "is_readable", counting)
        for _ in range(5):
            assert (await pool.request("GET", server.url + "/")).reused
        assert len(probes) == 5 and len(set(probes)) == 1  # the newest, every time
        assert pool.statistics().opened_total == count
        assert_quiet(pool)


async def test_idle_expiry_opens_a_fresh_connection(
    fd_baseline: int, mock_clock: trio.testing.MockClock
) -> None:
    async with open_server() as server, open_pool(idle_expiry=4.0) as pool:
        await pool.request("GET", server.url + "/")
        mock_clock.jump(3.9)
        assert (await pool.request("GET", server.url + "/")).reused
        mock_clock.jump(4.0)
        response = await pool.request("GET", server.url + "/")
        assert not response.reused
        assert server.accepted == 2
        stats = pool.statistics()
        assert (stats.opened_total, stats.closed_total, stats.idle) == (2, 1, 1)
        assert_quiet(pool)


async def test_expired_connections_are_closed_from_the_left_on_release(
    fd_baseline: int, mock_clock: trio.testing.MockClock
) -> None:
    async with open_server() as server, open_pool(idle_expiry=4.0) as pool:
        async with trio.open_nursery() as nursery:  # two connections, parked at t=0
            nursery.start_soon(pool.request, "GET", server.url + "/")
            nursery.start_soon(pool.request, "GET", server.url + "/")
        mock_clock.jump(3)
        assert (await pool.request("GET", server.url + "/")).reused  # newest, parked again at t=3
        mock_clock.jump(2)
        assert (await pool.request("GET", server.url + "/")).reused
        # Its release at t=5 swept the one parked at t=0 off the left end.
        stats = pool.statistics()
        assert (stats.idle, stats.closed_total, stats.opened_total) == (1, 1, 2)
        await server.wait_until(lambda: server.closed == 1)


async def test_engine_closed_idle_connection_is_detected_before_reuse(fd_baseline: int) -> None:
    async with open_server() as server, open_pool() as pool:
        await pool.request("GET", server.url + "/")
        await server.close_idle(1)
        response = await pool.request("GET", server.url + "/")
        assert response.status == 200 and not response.reused
        assert server.accepted == 2
        stats = pool.statistics()
        assert (stats.opened_total, stats.reused_total, stats.closed_total) == (2, 0, 1)
        assert_quiet(pool)


async def test_connection_close_response_is_not_reused(fd_baseline: int) -> None:
    async def handler(ex: Exchange) -> None:
        await ex.respond(200, b"bye", close=True)

    async with open_server(handler) as server, open_pool() as pool:
        for _ in range(2):
            response = await pool.request("GET", server.url + "/")
            assert response.content == b"bye" and not response.reused
        assert server.accepted == 2
        stats = pool.statistics()
        assert (stats.idle, stats.opened_total, stats.closed_total) == (0, 2, 2)
        assert_quiet(pool)


async def test_bytes_after_a_response_make_the_connection_unusable(fd_baseline: int) -> None:
    async def handler(ex: Exchange) -> None:
        await ex.send_raw(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")
        await ex.wait_client_hangup()

    async with open_server(handler) as server, open_pool() as pool:
        assert (await pool.request("GET", server.url + "/")).content == b"ok"
        stats = pool.statistics()
        assert (stats.idle, stats.closed_total) == (0, 1)
        await server.wait_until(lambda: server.closed == 1)
        assert_quiet(pool)


async def test_connections_released_after_the_pool_closed_are_not_parked(fd_baseline: int) -> None:
    gate = trio.Event()

    async def handler(ex: Exchange) -> None:
        await gate.wait()
        await ex.respond(200, b"late")

    async with open_server(handler) as server, trio.open_nursery() as nursery:
        async with open_pool() as pool:
            nursery.start_soon(pool.request, "GET", server.url + "/")
            await server.wait_until(lambda: len(server.requests) == 1)
        gate.set()  # the request finishes after open_pool's block has exited
    stats = pool.statistics()
    assert (stats.idle, stats.closed_total) == (0, 1)
    assert_quiet(pool)


@pytest.mark.parametrize("chunked", [False, True])
async def test_chunked_and_content_length_bodies(fd_baseline: int, chunked: bool) -> None:
    body = bytes(range(256)) * 40

    async def handler(ex: Exchange) -> None:
        await ex.respond(200, body, chunked=chunked)

    async with open_server(handler) as server, open_pool() as pool:
        for _ in range(2):
            response = await pool.request("GET", server.url + "/")
            assert response.content == body
        async with pool.stream("GET", server.url + "/") as streamed:
            assert streamed.reused
            assert b"".join([c async for c in streamed.aiter_bytes()]) == body
        assert server.accepted == 1
        assert_quiet(pool)


async def test_50_mib_body_streams_byte_exact(fd_baseline: int) -> None:
    body = random.Random(7).randbytes(50 * 1024 * 1024)

    async def handler(ex: Exchange) -> None:
        await ex.respond(200, body, [(b"content-type", b"application/octet-stream")])

    async with open_server(handler) as server, open_pool() as pool:
        digest = hashlib.sha256()
        size = 0
        async with pool.stream("GET", server.url + "/big") as response:
            assert response.status == 200
            async for chunk in response.aiter_bytes():
                assert type(chunk) is bytes
                digest.update(chunk)
                size += len(chunk)
        assert size == len(body)
        assert digest.digest() == hashlib.sha256(body).digest()
        assert pool.statistics().idle == 1  # read to the end: parked for reuse
        assert_quiet(pool)


async def test_leaving_a_stream_early_closes_the_connection(fd_baseline: int) -> None:
    async def handler(ex: Exchange) -> None:
        await ex.respond(200, b"x" * 100_000)

    async with open_server(handler) as server, open_pool() as pool:
        async with pool.stream("GET", server.url + "/") as response:
            async for _chunk in response.aiter_bytes():
                break
        stats = pool.statistics()
        assert (stats.idle, stats.closed_total) == (0, 1)
        await server.wait_until(lambda: server.closed == 1)
        assert_quiet(pool)


async def test_close_idle_by_origin(fd_baseline: int) -> None:
    async with open_server() as a, open_server() as b, open_pool() as pool:
        await pool.request("GET", a.url + "/")
        await pool.request("GET", b.url + "/")
        pool.close_idle(a.url)
        assert pool.statistics().idle == 1
        await a.wait_until(lambda: a.closed == 1)
        pool.close_idle("http://127.0.0.1:1")  # unknown origin: no-op
        pool.close_idle()
        assert pool.statistics().idle == 0
        assert pool.statistics().closed_total == 2


async def test_statistics_is_a_frozen_record() -> None:
    async with open_pool() as pool:
        stats = pool.statistics()
        with pytest.raises(dataclasses.FrozenInstanceError):
            stats.idle = 3  # type: ignore[misc]
        assert stats == type(stats)(0, 0, 0, 0, 0, 0, 0)


async def test_bad_urls_are_value_errors() -> None:
    async with open_pool() as pool:
        for url in ("https://x/", "ftp://x", "http:///path", "http://h:99999/"):
            with pytest.raises(ValueError):
                await pool.request("GET", url)
