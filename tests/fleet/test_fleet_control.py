"""The control plane is the fleet's (docs/fleet.md, "Control plane"): a change made on
one member is applied by every live member before the admin call returns."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import orjson
import trio
import trio.testing
from fleet_testing import open_members, until_members
from gateway_harness import generation_requests, open_sim


async def test_pause_on_one_member_holds_requests_on_another_and_resume_releases_both(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, valkey, fleet_name, stack, member_ttl=1.0)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        paused = await ca.post("/admin/pause", json={"mode": "wait"})
        assert paused.status_code == 200, paused.text
        # Returned only once B applied it too.
        assert all(e.paused for e in b.state.client.engines.list())
        assert paused.json()["fleet"]["control_version"] >= 1

        statuses: list[int] = []

        async def complete(client: httpx.AsyncClient) -> None:
            body = {"model": "sim-base", "prompt": [1, 2], "max_tokens": 4}
            statuses.append((await client.post("/v1/completions", content=orjson.dumps(body))).status_code)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(complete, cb)
                nursery.start_soon(complete, ca)
                # Both wait in QUEUED: nothing reached the engine.
                while b.state.client.statistics().queued + a.state.client.statistics().queued < 2:
                    await trio.testing.wait_all_tasks_blocked()
                assert generation_requests(engine) == 0
                resumed = await cb.post("/admin/resume", json={})
                assert resumed.status_code == 200
        assert statuses == [200, 200]
        assert generation_requests(engine) == 2
        assert not any(e.paused for gw in (a, b) for e in gw.state.client.engines.list())


async def test_engines_and_adapters_changed_on_one_member_reach_every_member_and_joiners(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(capacity=0) as engine, open_sim(capacity=0) as second, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, valkey, fleet_name, stack, member_ttl=1.0)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as ca:
            assert (await ca.post("/admin/engines", json={"url": second.url})).status_code == 201
            lora = {"name": "lora-x", "path": "/p/x", "parent": "sim-base"}
            assert (await ca.post("/admin/adapters", json=lora)).status_code == 201
            removed = await ca.request("DELETE", "/admin/engines", params={"url": engine.url})
            assert removed.status_code == 200
        for gw in (a, b):
            assert [e.url for e in gw.state.client.engines.list()] == [second.url]
            assert gw.state.client.adapters.list().get("lora-x") == "/p/x"
            # The parent is part of the fleet's record, not one member's memory.
            async with httpx.AsyncClient(base_url=gw.url) as cg:
                listed = (await cg.get("/admin/adapters")).json()["adapters"]
            assert {"name": "lora-x", "path": "/p/x", "parent": "sim-base"} in listed
        # A member joining later applies the fleet's state before it takes traffic.
        (c,) = await open_members(engine.url, valkey, fleet_name, stack, 1, member_ttl=1.0)
        assert [e.url for e in c.state.client.engines.list()] == [second.url]
        assert c.state.client.adapters.list().get("lora-x") == "/p/x"
        assert c.state.client.adapters.parent("lora-x") == "sim-base"
        async with httpx.AsyncClient(base_url=c.url) as cc:
            engines = (await cc.get("/admin/engines")).json()
        assert set(engines["fleet"]["engines"]) == {second.url}
        assert len(engines["fleet"]["members"]) == 3


async def test_a_member_that_does_not_apply_a_change_is_named_in_a_503(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        (a,) = await open_members(engine.url, valkey, fleet_name, stack, 1, member_ttl=1.0)
        fleet = a.state.fleet
        fleet.control.ack_timeout = 0.5
        import coredis

        async with coredis.Redis(unix_socket_path=str(valkey.socket)) as redis:
            # A live member (it heartbeats) that never applies control changes.
            record = {"host": "ghost", "pid": 1, "demand": {}, "share": {}, "control": 0}
            await redis.set(fleet.keys.member("a-ghost"), orjson.dumps(record), px=30_000)
            await redis.sadd(fleet.keys.members, ["a-ghost"])
        with trio.fail_after(30):
            while "a-ghost" not in fleet.members:
                await fleet.wait_tick()
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as client:
            answer = await client.post("/admin/pause", json={})
        assert answer.status_code == 503
        assert "a-ghost" in answer.json()["error"]["message"]
        assert answer.json()["error"]["code"] == "fleet_lagging"
        # This member applied it all the same.
        assert all(e.paused for e in a.state.client.engines.list())
