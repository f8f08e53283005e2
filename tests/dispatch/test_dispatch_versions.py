"""One weight version across the engines: added and re-admitted engines are held out until they report it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import trio
import trio.testing
from dispatch_testing import body, client_for, completions

from trioforward.sim import open_engine


async def until_released(client: Any, predicate: Callable[[], bool]) -> None:
    """Wait for ``predicate()``, re-checked at each change of an engine's eligibility
    (a release from the version hold makes a healthy, unpaused engine eligible)."""
    with trio.fail_after(30):
        while not predicate():
            await client._registry.wait_changed()


async def set_version(engine: object, version: str) -> None:
    async with httpx.AsyncClient() as http:
        r = await http.post(engine.url + "/update_weight_version", json={"new_version": version})  # type: ignore[attr-defined]
        assert r.status_code == 200


async def test_an_added_engine_takes_work_only_once_it_reports_the_version(fd_baseline: int) -> None:
    async with open_engine() as first, open_engine() as second, client_for(
        first, health_interval=0.05
    ) as client:
        await client.pause(engine_mode="abort")
        await client.resume(weight_version="v1")
        info = client.engines.add(second.url)
        (held,) = [e for e in client.engines.list() if e.url == second.url]
        assert held.held_out is not None and "v1" in held.held_out
        for _ in range(6):
            await client.post("/v1/completions", json=body())
        assert completions(second) == 0 and completions(first) == 6  # it got nothing
        await set_version(second, "v1")  # the engine now runs v1 and says so
        await until_released(client, lambda: all(e.held_out is None for e in client.engines.list()))
        (now,) = [e for e in client.engines.list() if e.url == info.url]
        assert now.weight_version == "v1"
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(lambda: client.post("/v1/completions", json=body(max_tokens=2)))
        assert completions(second) > 0


async def test_an_engine_readmitted_after_an_ejection_stays_out_until_it_reports(fd_baseline: int) -> None:
    async with open_engine() as first, open_engine() as second, client_for(
        first, second, health_interval=0.05, health_failures=1, health_successes=1
    ) as client:
        await client.pause(engine_mode="abort")
        await client.resume(weight_version="v2")
        registry = client._registry
        engine = registry.get(second.url)
        registry.record_failure(engine)  # ejected (during an update, say)
        assert not engine.healthy
        registry.record_success(engine, probe=True)  # back: but on which weights?
        assert engine.healthy and engine.held_out is not None and not engine.eligible
        # Its resume told it v2 before the ejection: its report releases it.
        await until_released(client, lambda: engine.held_out is None)
        assert engine.reported_version == "v2" and engine.eligible


async def test_an_engine_that_cannot_report_stays_out_until_confirmed(fd_baseline: int) -> None:
    async with open_engine() as first, open_engine(kind="none") as mute, client_for(
        first, health_interval=0.05
    ) as client:
        await client.resume(weight_version="v3")
        client.engines.add(mute.url)
        engine = client.engines.get(mute.url)
        # Its watch asks it (loopback, no timer before the answer): once every task is
        # blocked, it has found that the engine cannot report a version.
        await trio.testing.wait_all_tasks_blocked()
        assert engine.held_out is not None and "cannot report" in engine.held_out
        assert not client.versions.confirm(engine, "v2")  # not the current version
        assert engine.held_out is not None
        assert client.versions.confirm(engine, "v3")
        assert engine.held_out is None and engine.eligible


async def test_with_no_version_ever_recorded_nothing_is_held(fd_baseline: int) -> None:
    async with open_engine() as first, open_engine() as second, client_for(first) as client:
        client.engines.add(second.url)
        assert all(e.held_out is None for e in client.engines.list())
