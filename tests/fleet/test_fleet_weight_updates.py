"""A weight update is the fleet's (docs/operations.md, "Fleet mode"): every member
gates and replays its own requests, the engine is paused once, and a resume on
any member resumes the engine and gives every member the new weight version."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import orjson
import trio
from fleet_testing import open_members, until_members
from gateway_harness import generation_requests, open_gateway, open_sim

BODY = {"model": "sim-base", "prompt": [1, 2], "max_tokens": 30, "return_token_ids": True}


async def test_engine_pause_and_replay_are_fleet_wide(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(decode_ms_per_token=20) as engine, AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                open_gateway(
                    engine.url, state_url=valkey.url, fleet_name=fleet_name,
                    lease_interval=0.05, member_ttl=1.0,
                )
            )
            for _ in range(2)
        ]  # fmt: skip
        with trio.fail_after(30):
            while not all(len(gw.state.fleet.members) == 2 for gw in (a, b)):
                await a.state.fleet.wait_tick()
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        replies: list[httpx.Response] = []

        async def complete(client: httpx.AsyncClient) -> None:
            replies.append(await client.post("/v1/completions", content=orjson.dumps(BODY)))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for client in (ca, cb, ca, cb):
                    nursery.start_soon(complete, client)
                await engine.stats.wait_for(lambda s: s.running == 4)
                paused = await ca.post("/admin/pause", json={"engine_mode": "abort", "replay": True})
                assert paused.status_code == 200, paused.text
                # Applied by both members; the engine itself paused once.
                assert all(e.paused for gw in (a, b) for e in gw.state.client.engines.list())
                assert engine.stats.pauses == {"abort": 1} and engine.rl.paused
                assert a.state.client.statistics().in_flight == 0
                assert b.state.client.statistics().in_flight == 0
                resumed = await cb.post("/admin/resume", json={"weight_version": "v5"})
                assert resumed.status_code == 200, resumed.text
        assert not engine.rl.paused and engine.rl.weight_version == "v5"
        assert [r.status_code for r in replies] == [200] * 4
        for reply in replies:
            assert reply.headers["x-weight-version"] == "v5"
            choice = reply.json()["choices"][0]
            assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 30
        assert engine.stats.completed_by_version == {"v5": 4}
        assert generation_requests(engine) == 8  # each ran twice: once cut, once whole
        assert a.state.client.weight_version == b.state.client.weight_version == "v5"


async def test_resuming_a_gate_only_pause_never_calls_the_engine_even_when_it_is_down(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    # Drain one engine (gate-only pause), stop it, resume it while it is down: a
    # resume of a gate-only pause must not call the engine's /resume (it would
    # fail, and leave every member's gate closed). Engine-level pauses still are.
    async with open_sim() as engine, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, valkey, fleet_name, stack)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        drained = await ca.post("/admin/pause", json={"engines": [engine.url], "mode": "wait"})
        assert drained.status_code == 200, drained.text
        await engine.stop_listening()
        resumed = await cb.post("/admin/resume", json={"engines": [engine.url]})
        assert resumed.status_code == 200, resumed.text
        assert not any(e.paused for gw in (a, b) for e in gw.state.client.engines.list())
        assert engine.stats.resumes == 0
        await engine.start_listening()


async def test_continue_is_fleet_wide_and_each_member_continues_its_own(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(decode_ms_per_token=20) as engine, AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                open_gateway(
                    engine.url, state_url=valkey.url, fleet_name=fleet_name,
                    lease_interval=0.05, member_ttl=1.0,
                )
            )
            for _ in range(2)
        ]  # fmt: skip
        with trio.fail_after(30):
            while not all(len(gw.state.fleet.members) == 2 for gw in (a, b)):
                await a.state.fleet.wait_tick()
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        await cb.post("/admin/resume", json={"weight_version": "v4"})
        replies: list[httpx.Response] = []

        async def complete(client: httpx.AsyncClient) -> None:
            replies.append(await client.post("/v1/completions", content=orjson.dumps(BODY)))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for client in (ca, cb, ca, cb):
                    nursery.start_soon(complete, client)
                await engine.stats.wait_for(lambda s: s.running == 4)
                await trio.sleep(0.2)  # some tokens decoded (not needed: 0 tokens go whole)
                body = {"engine_mode": "abort", "replay": "continue"}
                paused = await ca.post("/admin/pause", json=body)
                assert paused.status_code == 200, paused.text
                assert engine.stats.pauses == {"abort": 1} and engine.rl.paused
                resumed = await cb.post("/admin/resume", json={"weight_version": "v5"})
                assert resumed.status_code == 200, resumed.text
        assert [r.status_code for r in replies] == [200] * 4
        for reply in replies:
            choice = reply.json()["choices"][0]
            assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 30
            spans = choice["weight_versions"]
            assert spans[-1]["version"] == "v5" and spans[-1]["end"] == 30
            assert {s["version"] for s in spans} <= {"v4", "v5"}
        continued = sum(gw.state.client.continued.answers for gw in (a, b))
        # What the engine ended was continued by the member holding it, not re-run:
        # every token decoded once (give or take one at a seam per request).
        assert 4 * 30 <= engine.stats.tokens_decoded <= 4 * 30 + 4
        assert continued == engine.stats.pause_aborted - sum(
            gw.state.client.continued.whole for gw in (a, b)
        )


async def test_a_request_the_engine_held_across_a_continue_pause_names_the_new_version(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    # vLLM 0.32 holds a request that reaches it after its pause and runs it after the
    # resume, whole, on the new weights; members do not close it (docs/operations.md).
    async with open_sim(decode_ms_per_token=5) as engine, AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                open_gateway(
                    engine.url, state_url=valkey.url, fleet_name=fleet_name,
                    lease_interval=0.05, member_ttl=1.0,
                )
            )
            for _ in range(2)
        ]  # fmt: skip
        with trio.fail_after(30):
            while not all(len(gw.state.fleet.members) == 2 for gw in (a, b)):
                await a.state.fleet.wait_tick()
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        await cb.post("/admin/resume", json={"weight_version": "v4"})
        await engine.rl.pause("abort")  # the engine paused before the request reaches it
        replies: list[httpx.Response] = []

        async def complete() -> None:
            replies.append(await ca.post("/v1/completions", content=orjson.dumps(BODY)))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(complete)
                await engine.stats.wait_for(lambda s: s.held == 1)
                body = {"engine_mode": "abort", "replay": "continue"}
                assert (await cb.post("/admin/pause", json=body)).status_code == 200
                assert (await cb.post("/admin/resume", json={"weight_version": "v5"})).status_code == 200
        [reply] = replies
        choice = reply.json()["choices"][0]
        assert len(choice["token_ids"]) == 30 and engine.stats.tokens_decoded == 30
        assert reply.headers["x-weight-version"] == "v5"  # run after the resume only
        assert choice["weight_versions"] == [{"version": "v5", "start": 0, "end": 30}]


async def test_a_resume_on_one_member_overtaking_a_wait_pause_on_another_leaves_nothing_paused(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    # Member A takes a wait pause with generations in flight; while the members
    # drain, member B takes a resume. Whatever the order the calls reach the
    # engine in, it ends resumed and every gate open (before: B resumed the not
    # yet paused engine, then A paused it; new requests hung on it).
    async with open_sim(decode_ms_per_token=20) as engine, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, valkey, fleet_name, stack)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        replies: list[httpx.Response] = []
        paused: list[httpx.Response] = []

        async def complete(client: httpx.AsyncClient) -> None:
            replies.append(await client.post("/v1/completions", content=orjson.dumps(BODY)))

        async def pause() -> None:
            paused.append(await ca.post("/admin/pause", json={"engine_mode": "wait"}))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for client in (ca, cb):
                    nursery.start_soon(complete, client)
                await engine.stats.wait_for(lambda s: s.running == 2)
                nursery.start_soon(pause)
                while not all(e.paused for gw in (a, b) for e in gw.state.client.engines.list()):
                    await a.state.fleet.wait_tick()  # every member gated: draining
                resumed = await cb.post("/admin/resume", json={"weight_version": "v2"})
                assert resumed.status_code == 200, resumed.text
        [p] = paused
        assert p.status_code in (200, 409), p.text  # 409 pause_overtaken when it came second
        if p.status_code == 409:
            assert p.json()["error"]["code"] == "pause_overtaken"
        assert [r.status_code for r in replies] == [200, 200]
        assert engine.stats.pauses == {"wait": 1} and not engine.rl.paused
        assert engine.stats.resumes >= 1 and engine.rl.weight_version == "v2"
        assert not any(e.paused for gw in (a, b) for e in gw.state.client.engines.list())
        with trio.fail_after(30):  # dispatched to the engine and answered, from both members
            for client in (ca, cb):
                assert (await client.post("/v1/completions", content=orjson.dumps(BODY))).status_code == 200
