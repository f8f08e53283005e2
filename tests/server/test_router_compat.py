"""slime-style code against the gateway as its SGLang router: engines registered
with /add_worker, /generate with input_ids, the rollout aborted through the
workers /list_workers names (docs/compatibility.md, "Pointing slime-style code
at the gateway")."""

from __future__ import annotations

from typing import Any

import httpx
import trio
from gateway_harness import open_gateway, open_sim

LONG = 4000


async def until(predicate: Any) -> None:
    """Return once ``predicate()`` holds (the sim's decode loop keeps tasks busy, so polled)."""
    with trio.fail_after(60):  # a hang guard only
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


async def post(http: httpx.AsyncClient, out: dict[str, Any], key: str, body: dict[str, Any]) -> None:
    out[key] = await http.post("/generate", json=body)


async def test_slime_style_registration_generate_and_abort_all(fd_baseline: int) -> None:
    async with (
        open_sim(kind="sglang", decode_ms_per_token=5) as engine,
        open_gateway(engine_capacity=2, abort_grace=30.0) as gw,
    ):
        async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http:
            added = await http.post(f"/add_worker?url={engine.url}")
            assert added.status_code == 200 and added.json()["status"] == "success"
            with trio.fail_after(10):
                await gw.state.client.engines.wait_kind(engine.url)
            listed = (await http.get("/admin/engines")).json()["engines"]
            assert [(e["url"], e["kind"], e["token_route"]) for e in listed] == [(engine.url, "sglang", True)]
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}
            one = (await http.post("/generate", json={**body, "rid": "s-1"})).json()
            assert one["meta_info"]["id"] == "s-1" and len(one["meta_info"]["output_token_logprobs"]) == 4
            out: dict[str, Any] = {}
            long = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": LONG}}
            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(post, http, out, f"r{i}", {**long, "rid": f"r-{i}"})
                await until(lambda: engine.stats.running == 2 and gw.state.client.statistics().queued == 1)
                workers = (await http.get("/list_workers")).json()["urls"]
                assert workers == [gw.url]  # the gateway itself, so the abort sees its queue too
                assert (await http.get("/workers")).json()["workers"] == [{"url": gw.url}]
                for url in workers:
                    aborted = await http.post(f"{url}/abort_request", json={"abort_all": True})
                    assert aborted.status_code == 200
            for i in range(3):
                meta = out[f"r{i}"].json()["meta_info"]
                assert meta["finish_reason"]["type"] == "abort" and meta["id"] == f"r-{i}"
            removed = await http.post(f"/remove_worker?url={engine.url}")
            assert removed.status_code == 200 and (await http.get("/admin/engines")).json()["engines"] == []
            assert (await http.post(f"/remove_worker?url={engine.url}")).status_code == 404
            assert (await http.post("/add_worker")).json()["error"]["param"] == "url"
        assert engine.stats.by_path["/generate"] == 1 + 2  # the queued one never reached it
        assert engine.stats.pause_aborted == 2
        assert await gw.pool_active() == 0


async def test_worker_registration_takes_the_admin_token(fd_baseline: int) -> None:
    async with open_sim(kind="sglang") as engine, open_gateway(admin_token="adm-token-777") as gw:
        async with httpx.AsyncClient(base_url=gw.url) as http:
            assert (await http.post(f"/add_worker?url={engine.url}")).status_code == 401
            assert gw.state.client.engines.list() == []
            auth = {"Authorization": "Bearer adm-token-777"}
            assert (await http.post(f"/add_worker?url={engine.url}", headers=auth)).status_code == 200
            assert [e.url for e in gw.state.client.engines.list()] == [engine.url]
