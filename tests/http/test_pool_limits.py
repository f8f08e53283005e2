"""max_connections per origin: FIFO waiters, direct slot hand-off, cancellation while waiting."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing
from pool_testing import Exchange, assert_quiet, open_server

from trioforward.http import ConnectTimeout, Phase, open_pool


async def test_limit_queues_requests_in_fifo_order(fd_baseline: int) -> None:
    gate = trio.Event()

    async def handler(ex: Exchange) -> None:
        if ex.body == b"first":
            await gate.wait()
        await ex.respond(200, ex.body)

    async with open_server(handler) as server, open_pool(max_connections=1) as pool:
        finished: list[bytes] = []

        async def call(body: bytes) -> None:
            response = await pool.request("POST", server.url + "/", content=body)
            finished.append(response.content)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, b"first")
            await server.wait_until(lambda: len(server.requests) == 1)
            for name in (b"b", b"c", b"d"):
                nursery.start_soon(call, name)
                await trio.testing.wait_all_tasks_blocked()  # queue them in this order
            stats = pool.statistics()
            assert (stats.active, stats.waiting) == (1, 3)
            gate.set()
        assert finished == [b"first", b"b", b"c", b"d"]
        assert server.accepted == 1  # every waiter got the parked connection
        stats = pool.statistics()
        assert (stats.opened_total, stats.reused_total, stats.idle) == (1, 3, 1)
        assert_quiet(pool)


async def test_limit_is_per_origin(fd_baseline: int) -> None:
    gate = trio.Event()

    async def handler(ex: Exchange) -> None:
        await gate.wait()
        await ex.respond(200, b"ok")

    async with open_server(handler) as a, open_server(handler) as b:
        async with open_pool(max_connections=1) as pool, trio.open_nursery() as nursery:
            nursery.start_soon(pool.request, "GET", a.url + "/")
            nursery.start_soon(pool.request, "GET", b.url + "/")
            nursery.start_soon(pool.request, "GET", a.url + "/")
            await a.wait_until(lambda: len(a.requests) == 1)
            await b.wait_until(lambda: len(b.requests) == 1)
            await trio.testing.wait_all_tasks_blocked()
            stats = pool.statistics()
            assert (stats.active, stats.waiting) == (2, 1)
            gate.set()
        assert_quiet(pool)


async def test_unlimited_opens_one_connection_per_concurrent_request(fd_baseline: int) -> None:
    arrived = trio.Event()
    count = 40

    async def handler(ex: Exchange) -> None:
        if len(ex.server.requests) == count:
            arrived.set()
        await arrived.wait()
        await ex.respond(200, b"ok")

    async with open_server(handler) as server, open_pool() as pool:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(pool.request, "GET", server.url + "/")
        assert server.accepted == count
        stats = pool.statistics()
        assert (stats.opened_total, stats.idle) == (count, count)
        assert_quiet(pool)


async def test_cancelled_waiter_leaves_the_queue_and_the_slot_moves_on(fd_baseline: int) -> None:
    gate = trio.Event()

    async def handler(ex: Exchange) -> None:
        if ex.body == b"first":
            await gate.wait()
        await ex.respond(200, ex.body)

    async with open_server(handler) as server, open_pool(max_connections=1) as pool:
        results: list[bytes] = []

        async def call(body: bytes) -> None:
            results.append((await pool.request("POST", server.url + "/", content=body)).content)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, b"first")
            await server.wait_until(lambda: len(server.requests) == 1)
            doomed_scope = trio.CancelScope()
            nursery.start_soon(_run_in, doomed_scope, call, b"doomed")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call, b"after")
            await trio.testing.wait_all_tasks_blocked()
            assert pool.statistics().waiting == 2
            doomed_scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert pool.statistics().waiting == 1
            gate.set()
        assert results == [b"first", b"after"]
        assert [ex.body for ex in server.requests] == [b"first", b"after"]
        assert_quiet(pool)


async def _run_in(scope: trio.CancelScope, fn: object, *args: object) -> None:
    with scope:
        await fn(*args)  # type: ignore[operator]


async def test_deadline_while_waiting_for_a_slot(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    gate = trio.Event()

    async def handler(ex: Exchange) -> None:
        await gate.wait()
        await ex.respond(200, b"ok")

    async with open_server(handler) as server, open_pool(max_connections=1) as pool:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.request, "GET", server.url + "/")
            await server.wait_until(lambda: len(server.requests) == 1)
            with pytest.raises(ConnectTimeout) as info:
                await pool.request("GET", server.url + "/", deadline=trio.current_time() + 5)
            assert info.value.phase is Phase.CONNECT and not info.value.reused
            assert info.value.response_bytes == 0
            assert pool.statistics().waiting == 0
            gate.set()
        # The slot still works after the timed-out waiter left.
        assert (await pool.request("GET", server.url + "/", deadline=math.inf)).reused
        assert server.accepted == 1
        assert_quiet(pool)


async def test_negative_limit_is_rejected() -> None:
    with pytest.raises(ValueError):
        async with open_pool(max_connections=-1):
            pass  # pragma: no cover
