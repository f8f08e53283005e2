"""An operator's weight-version confirmation is the fleet's (docs/operations.md, "One
weight version across the engines"): confirmed on one member, every member takes the
engine back, and a member that joins later too."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import trio
from fleet_testing import open_members, until_members
from gateway_harness import Gateway, open_sim


async def _row(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    (row,) = [e for e in (await client.get("/admin/engines")).json()["engines"] if e["url"] == url]
    return row


async def _until_cannot_report(client: httpx.AsyncClient, url: str) -> None:
    while True:
        held = (await _row(client, url))["held_out"]
        if held and "cannot report" in held:
            return
        await trio.sleep(0.02)


async def test_a_version_confirmed_on_one_member_releases_the_engine_on_every_member(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim() as first, open_sim(kind="none") as mute, AsyncExitStack() as stack:
        knobs = {"health_interval": 0.05}
        a, b = await open_members(first.url, valkey, fleet_name, stack, **knobs)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        with trio.fail_after(30):
            assert (await ca.post("/admin/resume", json={"weight_version": "v9"})).status_code == 200
            assert (await ca.post("/admin/engines", json={"url": mute.url})).status_code == 201
            for client in (ca, cb):  # added on both, held on both
                await _until_cannot_report(client, mute.url)
            wrong = await cb.post("/admin/engines", json={"url": mute.url, "weight_version": "v8"})
            assert wrong.status_code == 409 and wrong.json()["error"]["code"] == "weight_version_mismatch"
            assert "cannot report" in (await _row(ca, mute.url))["held_out"]  # a refusal changes nothing
            ok = await cb.post("/admin/engines", json={"url": mute.url, "weight_version": "v9"})
            assert ok.status_code == 200, ok.text
            # The call answers once every member applied it: held out nowhere.
            for gw, client in ((a, ca), (b, cb)):
                row = await _row(client, mute.url)
                assert row["held_out"] is None and row["weight_version"] == "v9"
                assert gw.state.client.engines.get(mute.url).eligible
        # A member joining later applies the confirmation as it joins.
        (c,) = await open_members(first.url, valkey, fleet_name, stack, n=1, **knobs)
        with trio.fail_after(30):
            await until_members([a, b, c], 3)
        assert _joined_and_released(c, mute.url)


def _joined_and_released(gw: Gateway, url: str) -> bool:
    engine = gw.state.client.engines.get(url)
    return engine.held_out is None and engine.eligible and engine.reported_version == "v9"
