"""The engines' own control routes in a fleet (docs/server.md, "The engines' own control
routes"; docs/fleet.md, "Control plane"): a pause sent to one member in the engine's
own shape holds work on every member; continue on another member resumes it."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from fleet_testing import open_members, until_members
from gateway_harness import open_sim

# kind: (its pause call, its continue call, a generation request on its native route)
ROUTES = {
    "sglang": (
        ("/pause_generation", {"mode": "abort"}),
        ("/continue_generation", {}),
        ("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}),
    ),
    "vllm": (
        ("/pause?mode=keep", None),
        ("/resume", None),
        ("/v1/completions", {"model": "sim-base", "prompt": [1, 2, 3], "max_tokens": 4}),
    ),
}


@pytest.mark.parametrize("kind", sorted(ROUTES))
async def test_an_engine_pause_on_one_member_holds_the_other_and_continue_there_resumes_all(
    valkey: Any, fleet_name: str, fd_baseline: int, kind: str
) -> None:
    (pause, pause_body), (resume, resume_body), (gen, gen_body) = ROUTES[kind]
    async with open_sim(kind=kind, capacity=0) as engine, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, valkey, fleet_name, stack, member_ttl=1.0)
        with trio.fail_after(30):
            await until_members([a, b], 2)
            for gw in (a, b):
                await gw.state.client.engines.wait_kind(engine.url)
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        paused = await ca.post(pause, json=pause_body)
        assert paused.status_code == 200, paused.text
        # Returned only once B applied it too; the engine was paused once.
        assert engine.rl.paused
        assert all(e.paused for gw in (a, b) for e in gw.state.client.engines.list())
        if kind == "vllm":
            assert (await cb.get("/is_paused")).json() == {"is_paused": True}
        generated = engine.stats.completed
        out: list[httpx.Response] = []

        async def generate() -> None:
            out.append(await cb.post(gen, json=gen_body))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(generate)
                # B holds it in QUEUED: nothing reached the engine.
                while b.state.client.statistics().queued < 1:
                    await trio.testing.wait_all_tasks_blocked()
                assert engine.stats.completed == generated
                resumed = await cb.post(resume, json=resume_body)
                assert resumed.status_code == 200, resumed.text
        assert [r.status_code for r in out] == [200]
        assert engine.stats.completed == generated + 1
        path = pause.partition("?")[0]
        assert engine.stats.by_path[path] == 1 and engine.stats.by_path[resume] == 1
        assert sum(engine.stats.pauses.values()) == 1 and engine.stats.resumes == 1
        assert not engine.rl.paused
        assert not any(e.paused for gw in (a, b) for e in gw.state.client.engines.list())
        if kind == "vllm":
            assert (await ca.get("/is_paused")).json() == {"is_paused": False}
