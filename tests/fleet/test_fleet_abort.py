"""POST /admin/abort in fleet mode: one call on one member ends a group spread over both."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import trio
from fleet_testing import open_members, until_members
from gateway_harness import open_sim

BODY = {"model": "sim-base", "prompt": [1, 2], "max_tokens": 4000, "return_token_ids": True}


async def test_one_abort_call_ends_a_group_on_every_member(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(decode_ms_per_token=5) as engine, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, valkey, fleet_name, stack, abort_grace=30.0)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=None))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=None))
        replies: list[httpx.Response] = []

        async def complete(client: httpx.AsyncClient, group: str) -> None:
            replies.append(
                await client.post("/v1/completions", json=BODY, headers={"X-Rollout-Group": group})
            )

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for client in (ca, cb, ca, cb):
                    nursery.start_soon(complete, client, "G")
                await engine.stats.wait_for(lambda s: s.running == 4)
                answer = await cb.post("/admin/abort", json={"group": "G"})
                assert answer.status_code == 200, answer.text
                data = answer.json()
        assert (data["queued"], data["on_engine"], data["finished"]) == (0, 4, 0)
        assert sorted(data["members"]) == sorted([a.state.fleet.member_id, b.state.fleet.member_id])
        assert all(c["on_engine"] == 2 for c in data["members"].values())
        assert [r.status_code for r in replies] == [200] * 4
        assert all(r.json()["choices"][0]["finish_reason"] == "abort" for r in replies)
        assert engine.stats.pause_aborted == 4


async def test_an_engine_abort_route_on_one_member_ends_a_request_on_another(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    """SGLang's /abort_request by rid, sent to member B, reaches the /generate member A runs
    (docs/server.md, "Token routes"); an unknown rid on B ends nothing."""
    async with open_sim(kind="sglang", decode_ms_per_token=5) as engine, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, valkey, fleet_name, stack, abort_grace=30.0)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=None))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=None))
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4000}}
        replies: dict[str, httpx.Response] = {}

        async def generate(rid: str) -> None:
            replies[rid] = await ca.post("/generate", json={**body, "rid": rid})

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for rid in ("x-1", "x-2"):
                    nursery.start_soon(generate, rid)
                await engine.stats.wait_for(lambda s: s.running == 2)
                assert (await cb.post("/abort_request", json={"rid": "nobody"})).status_code == 200
                answer = await cb.post("/abort_request", json={"rid": "x-1"})
                assert answer.status_code == 200 and answer.content == b""
                await engine.stats.wait_for(lambda s: s.pause_aborted == 1)
                assert "x-2" not in replies
                await cb.post("/abort_request", json={"abort_all": True})
        for rid in ("x-1", "x-2"):
            meta = replies[rid].json()["meta_info"]
            assert meta["id"] == rid and meta["finish_reason"]["type"] == "abort"
        assert engine.stats.pause_aborted == 2
