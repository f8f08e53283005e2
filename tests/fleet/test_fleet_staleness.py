"""Staleness-bounded admission in fleet mode: one declaration, one count across members."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import httpx
import trio
from fleet_testing import open_members, until_members
from gateway_harness import Gateway, open_sim

BODY = {"model": "sim-base", "prompt": [1, 2], "max_tokens": 2}


async def until(members: list[Gateway], predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds, re-checked at each member tick."""
    with trio.fail_after(60):
        while not predicate():
            await members[0].state.fleet.wait_tick()


async def test_the_bound_holds_across_two_members(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim() as engine, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, valkey, fleet_name, stack)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=None))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=None))
        declared = await ca.post("/admin/staleness", json={"tenant": "default", "step": 4, "eta": 0})
        assert declared.status_code == 201, declared.text
        for gw in (a, b):  # applied by both members
            (bound,) = gw.state.client.admission.statistics()
            assert (bound["step"], bound["eta"], bound["allowed"]) == (4, 0, 4)
        answers: list[httpx.Response] = []

        def completed() -> int:
            return int(engine.stats.by_path["/v1/completions"])

        def waiting() -> int:
            return sum(gw.state.client.admission.waiting for gw in (a, b))

        async def rollout(client: httpx.AsyncClient) -> None:
            answers.append(await client.post("/v1/completions", json=BODY))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(rollout, ca)
                nursery.start_soon(rollout, cb)
            await until([a, b], lambda: len(answers) == 4 and waiting() == 16)
            assert completed() == 4  # (0 + 0 + 1) x 4 across both members, not 4 each
            resumed = await cb.post("/admin/resume", json={"weight_version": "v1"})
            assert resumed.status_code == 200, resumed.text
            await until([a, b], lambda: len(answers) == 8 and waiting() == 12)
            assert completed() == 8
            for version in ("v2", "v3"):
                await ca.post("/admin/resume", json={"weight_version": version})
            await until([a, b], lambda: len(answers) == 16 and waiting() == 4)
            assert completed() == 16
            gone = await cb.request("DELETE", "/admin/staleness", json={"tenant": "default"})
            assert gone.status_code == 200, gone.text
        assert completed() == 20 and all(r.status_code == 200 for r in answers)
        listed = (await ca.get("/admin/staleness")).json()
        assert listed == {"bounds": []}
