"""Capacity leases: the engine's capacity is the fleet's (docs/fleet.md, "Capacity leases")."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import orjson
import trio
from fleet_testing import open_members
from gateway_harness import Gateway, generation_requests, open_sim

CAPACITY = 8
# Three members, the engine and 200 clients share one trio loop here, which stalls
# ticks for up to ~1.3 s in a burst: the TTL must outlast that (docs/fleet.md).
MEMBER_TTL = 3.0


async def _converged(gateways: list[Gateway], url: str) -> None:
    """Wait, tick by tick, until every member sees 3 members and the idle split."""
    while not (
        sorted(_shares(gateways, url)) == [2, 3, 3]
        and all(len(gw.state.fleet.members) == 3 for gw in gateways)
    ):
        for gw in gateways:
            await gw.state.fleet.wait_tick()


def _shares(gateways: list[Gateway], url: str) -> list[int]:
    return [gw.state.fleet.leases.applied[url] for gw in gateways]


async def test_three_members_keep_the_engine_at_its_capacity(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(capacity=0, decode_ms_per_token=2.0) as engine, AsyncExitStack() as stack:
        gateways = await open_members(
            engine.url, valkey, fleet_name, stack, 3, engine_capacity=CAPACITY, member_ttl=MEMBER_TTL
        )
        # Idle: the capacity is spread over the members and sums to it.
        with trio.fail_after(30):
            await _converged(gateways, engine.url)
        # /admin/engines says both: the engine's capacity, and this member's share.
        for gw in gateways:
            async with httpx.AsyncClient(base_url=gw.url) as admin:
                [listed] = (await admin.get("/admin/engines")).json()["engines"]
            assert listed["capacity"] == CAPACITY
            assert listed["share"] == gw.state.fleet.leases.applied[engine.url]
        engine.stats.reset()
        for gw in gateways:
            gw.state.fleet.longest_gap = 0.0

        statuses: list[int] = []

        async def one(i: int, client: httpx.AsyncClient) -> None:
            body = {"model": "sim-base", "prompt": [1, 2, 3], "max_tokens": 24, "seed": i}
            response = await client.post("/v1/completions", content=orjson.dumps(body))
            statuses.append(response.status_code)

        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=gw.url, timeout=60))
            for gw in gateways
        ]
        # Skewed load: member 0 gets most of it, so the shares must move.
        targets = [clients[0] if i % 4 else clients[1 + (i // 4) % 2] for i in range(200)]
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i, client in enumerate(targets):
                    nursery.start_soon(one, i, client)

        assert statuses == [200] * 200
        assert generation_requests(engine) == 200
        # The stated bound (docs/fleet.md): capacity, + at most members - 1 from the
        # floor of one while a lowered member drains (measured here: exactly 8; a
        # split without the held counts and the one-tick delay peaked at 12).
        # The invariant's precondition: no member's heartbeat was late enough to
        # drop it from the others' splits.
        assert all(gw.state.fleet.longest_gap < MEMBER_TTL - 0.05 for gw in gateways)
        assert engine.stats.peak_running <= CAPACITY + len(gateways) - 1
        with trio.fail_after(30):
            await _converged(gateways, engine.url)
        for gw in gateways:
            assert await gw.pool_active() == 0


async def test_a_dead_members_share_returns_within_member_ttl(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        (gateway,) = await open_members(
            engine.url, valkey, fleet_name, stack, 1, engine_capacity=CAPACITY, member_ttl=MEMBER_TTL
        )
        fleet = gateway.state.fleet
        # A member that wrote one heartbeat (busy on the engine) and then died.
        import coredis

        async with coredis.Redis(unix_socket_path=str(valkey.socket)) as redis:
            record = {"host": "ghost", "pid": 1, "demand": {engine.url: {"demand": 100, "held": 7}}, "share": {}}
            await redis.set(fleet.keys.member("a-ghost"), orjson.dumps(record), px=400)
            await redis.sadd(fleet.keys.members, ["a-ghost"])
        with trio.fail_after(30):
            while "a-ghost" not in fleet.members:
                await fleet.wait_tick()
            assert fleet.leases.applied[engine.url] < CAPACITY
            while "a-ghost" in fleet.members or fleet.leases.applied[engine.url] != CAPACITY:
                await fleet.wait_tick()
        # Its record expired (400 ms after its one write), the next tick dropped
        # it and the whole capacity is this member's again.
