"""Redis trouble (docs/fleet.md, "Failure modes"): the OpenAI path keeps serving on the
last shares, Tinker submits answer 503 + Retry-After, /health says so (200), one log
line per outage, and everything recovers by itself when Redis returns."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from typing import Any

import httpx
import orjson
import pytest
import trio
from fleet_testing import open_members, until_members
from gateway_harness import generation_requests, open_gateway, open_sim

PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]}


async def test_redis_stopped_and_restarted(
    valkey: Any, fleet_name: str, fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioforward.fleet")
    caplog.set_level(logging.INFO, logger="coredis")
    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        gw = await stack.enter_async_context(
            open_gateway(
                engine.url, state_url=valkey.url, fleet_name=fleet_name, engine_capacity=8,
                lease_interval=0.05, member_ttl=2.0,
            )
        )
        fleet = gw.state.fleet
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=gw.url, timeout=30))
        session = (await client.post(
            "/api/v1/create_sampling_session",
            json={"session_id": "s", "sampling_session_seq_id": 0, "base_model": "sim-base"},
        )).json()["sampling_session_id"]

        def sample(seq: int) -> dict[str, Any]:
            return {"sampling_session_id": session, "seq_id": seq, "num_samples": 1,
                    "prompt": PROMPT, "sampling_params": {"max_tokens": 4}}

        async def completion() -> int:
            body = {"model": "sim-base", "prompt": [1, 2], "max_tokens": 4}
            return (await client.post("/v1/completions", content=orjson.dumps(body))).status_code

        with trio.fail_after(30):
            while fleet.leases.applied.get(engine.url) != 8:
                await fleet.wait_tick()
        assert (await client.post("/api/v1/asample", json=sample(1))).status_code == 200

        valkey.stop()
        with trio.fail_after(30):
            while not fleet.degraded:
                await fleet.wait_tick()
            for _ in range(3):  # several ticks into the outage
                await fleet.wait_tick()
        assert fleet.leases.applied[engine.url] == 8  # the last share is kept
        assert [await completion() for _ in range(5)] == [200] * 5
        refused = await client.post("/api/v1/asample", json=sample(2))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        response = await client.get("/health")
        health = response.json()
        # Still ready (200); one status string per meaning: "degraded" is always 503.
        assert response.status_code == 200
        assert health["status"] == "shared_state_unreachable"
        assert health["fleet"]["state"] == "unreachable"

        valkey.start()
        with trio.fail_after(30):
            while fleet.degraded:
                await fleet.wait_tick()
        accepted = await client.post("/api/v1/asample", json=sample(2))
        assert accepted.status_code == 200
        polled = await client.post(
            "/api/v1/retrieve_future", json={"request_id": accepted.json()["request_id"]}
        )
        assert polled.status_code == 200
        assert (await client.get("/health")).json()["status"] == "ok"
        assert generation_requests(engine) == 5 + 2
        outage_lines = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(outage_lines) == 1  # one line per outage, not one per tick
        assert any("reachable again" in r.getMessage() for r in caplog.records)
        # The fleet's scripts are loaded on first use and again after the restart:
        # coredis's retry that loads them is not logged as an error-like line.
        scripts = [r.getMessage() for r in caplog.records if "No matching script" in r.getMessage()]
        assert scripts == []


async def test_a_redis_that_lost_the_control_state_does_not_make_the_next_change_a_no_op(
    valkey: Any, fleet_name: str, fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Valkey restarted without persistence: the control version starts again from 0.
    # A member must not take the next change (version 1 again) as one it applied.
    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, valkey, fleet_name, stack)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        await a.state.fleet.control.pause(None, "wait")
        assert await b.state.fleet.control.resume(None) == 2
        valkey.stop()
        valkey.start()
        with trio.fail_after(30):
            # Until each member applied the state as it is now and the other read that
            # in its heartbeat (until then an ack could count the old version).
            while any(r.control for gw in (a, b) for r in gw.state.fleet.members.values()):
                await a.state.fleet.wait_tick()
            assert await b.state.fleet.control.pause(None, "wait") == 1
        assert all(e.paused for gw in (a, b) for e in gw.state.client.engines.list())
        await a.state.fleet.control.resume(None)
        assert not any(e.paused for gw in (a, b) for e in gw.state.client.engines.list())
    assert any("version went back from 2 to 0" in r.getMessage() for r in caplog.records)


async def test_a_member_whose_record_lives_stays_in_view_when_it_is_missing_from_the_set(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    # After an outage, member A may prune B from the member set (B's record had
    # expired) just after B re-added itself: B must not drop out of A's view (its
    # futures would answer 410 "left the fleet") while B's record lives.
    import coredis

    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        (a,) = await open_members(engine.url, valkey, fleet_name, stack, n=1)
        fleet = a.state.fleet
        record = {"host": "b", "pid": 1, "demand": {}, "share": {}, "epoch": "bbbb"}
        async with coredis.Redis(unix_socket_path=str(valkey.socket)) as redis:
            await redis.set(fleet.keys.member("b"), orjson.dumps(record), px=60_000)
            await redis.sadd(fleet.keys.members, ["b"])
            with trio.fail_after(30):
                while "b" not in fleet.members:
                    await fleet.wait_tick()
            await redis.srem(fleet.keys.members, ["b"])  # the racing prune
            with trio.fail_after(30):
                for _ in range(5):
                    await fleet.wait_tick()
                    assert "b" in fleet.members and fleet.epoch_alive("bbbb")
            await redis.delete([fleet.keys.member("b")])  # B really leaves
            with trio.fail_after(30):
                while "b" in fleet.members:
                    await fleet.wait_tick()
        assert not fleet.epoch_alive("bbbb")
