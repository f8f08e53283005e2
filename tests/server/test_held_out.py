"""GET /admin/engines shows held-out engines and why; POST /admin/engines confirms a version."""

from __future__ import annotations

import httpx
import trio
from gateway_harness import open_gateway, open_sim


async def test_an_added_engine_that_cannot_report_is_shown_held_and_confirmed(fd_baseline: int) -> None:
    async with open_sim() as first, open_sim(kind="none") as mute, open_gateway(
        first.url, health_interval=0.05
    ) as gw:
        async with httpx.AsyncClient(base_url=gw.url) as http:
            assert (await http.post("/admin/resume", json={"weight_version": "v9"})).status_code == 200
            added = await http.post("/admin/engines", json={"url": mute.url})
            assert added.status_code == 201
            with trio.fail_after(30):
                while True:
                    (row,) = [e for e in (await http.get("/admin/engines")).json()["engines"] if e["url"] == mute.url]
                    if row["held_out"] and "cannot report" in row["held_out"]:
                        break
                    await trio.sleep(0.02)
            assert row["weight_version"] is None
            wrong = await http.post("/admin/engines", json={"url": mute.url, "weight_version": "v8"})
            assert wrong.status_code == 409 and wrong.json()["error"]["param"] == "weight_version"
            ok = await http.post("/admin/engines", json={"url": mute.url, "weight_version": "v9"})
            assert ok.status_code == 200
            (row,) = [e for e in ok.json()["engines"] if e["url"] == mute.url]
            assert row["held_out"] is None and row["weight_version"] == "v9"
            (first_row,) = [e for e in ok.json()["engines"] if e["url"] == first.url]
            assert first_row["held_out"] is None
