"""The engines' own control routes on the gateway (docs/server.md, "The engines' own
control routes"): SGLang's /pause_generation, /update_weights_from_disk,
/continue_generation, /flush_cache, /model_info and vLLM's /pause, /resume,
/is_paused and weight-transfer calls, each a fleet operation over every engine
of its kind, asserted on the sims' own counters."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import trio
from gateway_harness import open_gateway, open_sim

GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 200}}


async def kinds(gw: Any) -> None:
    client = gw.state.client
    with trio.fail_after(10):
        for e in client.engines.list():
            await client.engines.wait_kind(e.url)


async def test_sglang_pause_push_continue_over_two_engines_continues_the_calls_in_flight(
    fd_baseline: int,
) -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_sim(kind="sglang", decode_ms_per_token=10))
        b = await stack.enter_async_context(open_sim(kind="sglang", decode_ms_per_token=10))
        gw = await stack.enter_async_context(open_gateway(a.url, b.url))
        await kinds(gw)
        out: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

            async def one(i: int) -> None:
                out.append(await c.post("/generate", json={**GEN, "rid": f"r{i}"}))

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(one, i)
                with trio.fail_after(10):
                    await a.stats.wait_for(lambda s: s.running >= 1 and s.tokens_decoded >= 3)
                    await b.stats.wait_for(lambda s: s.running >= 1 and s.tokens_decoded >= 3)
                paused = await c.post("/pause_generation", json={"mode": "abort"})
                assert paused.status_code == 200, paused.text
                assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}
                assert a.rl.paused and b.rl.paused
                pushed = await c.post(
                    "/update_weights_from_disk", json={"model_path": "/ckpt/2", "weight_version": "v2"}
                )
                assert pushed.status_code == 200, pushed.text
                doc = pushed.json()
                assert doc["success"] is True and [e["success"] for e in doc["engines"]] == [True, True]
                assert a.rl.paused and b.rl.paused  # inside the pause: still paused
                resumed = await c.post("/continue_generation", json={})
                assert resumed.status_code == 200, resumed.text
            info = (await c.get("/model_info")).json()
        for engine in (a, b):
            assert engine.stats.by_path["/update_weights_from_disk"] == 1
            assert engine.stats.by_path["/pause_generation"] == 1
            assert engine.stats.by_path["/continue_generation"] == 1
            assert engine.stats.pauses["abort"] == 1 and engine.stats.resumes == 1
            assert engine.model_path == "/ckpt/2" and engine.rl.weight_version == "v2"
            assert not engine.rl.paused
        assert a.stats.pause_aborted + b.stats.pause_aborted == 4
        assert [r.status_code for r in out] == [200] * 4
        for reply in out:
            meta = reply.json()["meta_info"]
            assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 200
            assert meta["weight_versions"][-1]["version"] == "v2"
        assert gw.state.client.weights.version == "v2"
        assert info["weight_version"] == "v2" and info["model_path"] == "/ckpt/2"
        assert await gw.pool_active() == 0


async def test_a_push_one_engine_refuses_is_207_rolled_back_and_nothing_left_paused(
    fd_baseline: int,
) -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_sim(kind="sglang"))
        b = await stack.enter_async_context(open_sim(kind="sglang"))
        gw = await stack.enter_async_context(open_gateway(a.url, b.url))
        await kinds(gw)
        b.faults.fail_weight_push = 1
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            assert (await c.post("/pause_generation", json={"mode": "retract"})).status_code == 200
            pushed = await c.post(
                "/update_weights_from_disk", json={"model_path": "/ckpt/3", "weight_version": "v3"}
            )
            assert pushed.status_code == 207, pushed.text
            doc = pushed.json()
            assert doc["success"] is False and b.url in doc["message"]
            by_engine = {e["engine"]: e for e in doc["engines"]}
            assert by_engine[a.url]["success"] is True and by_engine[b.url]["success"] is False
            assert by_engine[b.url]["status"] == 400
            assert [(r["engine"], r["success"]) for r in doc["rolled_back"]] == [(a.url, True)]
            engines = (await c.get("/admin/engines")).json()["engines"]
            # A later generation runs: nothing was left paused.
            ran = await c.post("/generate", json={**GEN, "sampling_params": {"max_new_tokens": 2}})
            assert ran.status_code == 200
        assert a.stats.by_path["/update_weights_from_disk"] == 2  # the push and its undo
        assert b.stats.by_path["/update_weights_from_disk"] == 1
        assert a.model_path == "sim-base" and a.rl.weight_version == "default"
        assert b.model_path is None and b.rl.weight_version is None
        assert not a.rl.paused and not b.rl.paused
        assert a.stats.resumes == 1 and b.stats.resumes == 1
        assert [e["paused"] for e in engines] == [False, False]
        assert gw.state.client.weights.version is None


async def test_a_push_outside_a_pause_pauses_waits_and_resumes_on_the_new_version(
    fd_baseline: int,
) -> None:
    async with open_sim(kind="sglang", decode_ms_per_token=5) as a, open_gateway(a.url) as gw:
        await kinds(gw)
        out: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

            async def one() -> None:
                out.append(await c.post("/generate", json={**GEN, "sampling_params": {"max_new_tokens": 40}}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                with trio.fail_after(10):
                    await a.stats.wait_for(lambda s: s.running == 1)
                pushed = await c.post(
                    "/update_weights_from_disk", json={"model_path": "/ckpt/4", "weight_version": "v4"}
                )
                assert pushed.status_code == 200, pushed.text
                # The push waited for the generation running on the old weights.
                assert len(out) == 1 and a.stats.completed_by_version == {"None": 1}
        assert a.stats.pauses["in_place"] == 1 and a.stats.resumes == 1 and not a.rl.paused
        assert a.rl.weight_version == "v4" and gw.state.client.weights.version == "v4"


async def test_vllm_pause_transfer_resume_records_the_finish_version(fd_baseline: int) -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_sim(kind="vllm"))
        b = await stack.enter_async_context(open_sim(kind="vllm"))
        gw = await stack.enter_async_context(open_gateway(a.url, b.url))
        await kinds(gw)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            assert (await c.get("/is_paused")).json() == {"is_paused": False}
            assert (await c.post("/pause?mode=keep")).json() == {"status": "paused"}
            assert (await c.get("/is_paused")).json() == {"is_paused": True}
            for path, body in (
                ("/init_weight_transfer_engine", {"init_info": {"master_port": 1}}),
                ("/start_weight_update", {}),
                ("/update_weights", {"update_info": {"names": ["w"]}}),
                ("/finish_weight_update", {"weight_version": "v5"}),
            ):
                step = await c.post(path, json=body)
                assert step.status_code == 200, step.text
                assert [e["success"] for e in step.json()["engines"]] == [True, True]
            assert "message" in step.json()
            assert (await c.post("/resume")).json() == {"status": "resumed"}
            assert (await c.get("/weight_info")).json() == {"weight_version": "v5"}
            reset = await c.post("/reset_prefix_cache")
            assert reset.status_code == 200
        for engine in (a, b):
            assert engine.stats.pauses["keep"] == 1 and engine.stats.resumes == 1
            assert engine.stats.by_path["/update_weights"] == 1
            assert engine.stats.by_path["/reset_prefix_cache"] == 1
            assert engine.rl.weight_version == "v5" and not engine.rl.paused


async def test_a_vllm_transfer_step_one_engine_fails_is_207_and_resumes_every_engine(
    fd_baseline: int,
) -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_sim(kind="vllm"))
        b = await stack.enter_async_context(open_sim(kind="vllm"))
        gw = await stack.enter_async_context(open_gateway(a.url, b.url))
        await kinds(gw)
        b.faults.fail_weight_push = 1
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            assert (await c.post("/pause?mode=wait")).status_code == 200
            step = await c.post("/update_weights", json={"update_info": {}})
            assert step.status_code == 207, step.text
            assert {e["engine"]: e["status"] for e in step.json()["engines"]} == {a.url: 200, b.url: 500}
            assert (await c.get("/is_paused")).json() == {"is_paused": False}
        assert not a.rl.paused and not b.rl.paused
        assert a.stats.resumes == 1 and b.stats.resumes == 1


async def test_engine_routes_refuse_bad_input_and_need_the_admin_token(fd_baseline: int) -> None:
    async with open_sim(kind="sglang") as a, open_gateway(a.url, admin_token="s3cret") as gw:
        await kinds(gw)
        auth = {"authorization": "Bearer s3cret"}
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            denied = await c.post("/pause_generation", json={})
            assert denied.status_code == 401
            bad = await c.post("/pause_generation", json={"mode": "sideways"}, headers=auth)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "mode"
            typo = await c.post("/update_weights_from_disk", json={"modelpath": "/x"}, headers=auth)
            assert typo.status_code == 400 and typo.json()["error"]["param"] == "modelpath"
            missing = await c.post("/update_weights_from_disk", json={}, headers=auth)
            assert missing.status_code == 400 and missing.json()["error"]["param"] == "model_path"
            no_vllm = await c.post("/pause", headers=auth)
            assert no_vllm.status_code == 404 and no_vllm.json()["error"]["code"] == "engine_not_found"
        assert a.stats.by_path["/pause_generation"] == 0 and a.stats.by_path["/update_weights_from_disk"] == 0
        assert not a.rl.paused
