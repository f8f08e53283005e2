"""Off-policy control over HTTP: X-Weight-Policy and X-Weight-Staleness, the staleness
bound's admin calls and its Server-Timing / metrics figure, group tails, and the
whole weight update through the gateway on a mixed vLLM/SGLang fleet."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import trio
from gateway_harness import open_gateway, open_sim

BODY = {"model": "sim-base", "prompt": [1, 2, 3], "max_tokens": 2}


async def kinds(gw: Any) -> None:
    client = gw.state.client
    with trio.fail_after(10):
        for e in client.engines.list():
            await client.engines.wait_kind(e.url)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_policy_header_staleness_header_and_bad_policy(fd_baseline: int) -> None:
    async with open_sim() as a, open_sim() as b, open_gateway(a.url, b.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            await c.post("/admin/resume", json={"weight_version": "v1"})
            await c.post("/admin/pause", json={"engines": [a.url], "engine_mode": "abort"})
            await c.post("/admin/resume", json={"engines": [a.url], "weight_version": "v2"})
            before = b.stats.by_path["/v1/completions"]
            for _ in range(4):
                r = await c.post("/v1/completions", json=BODY, headers={"X-Weight-Policy": "latest"})
                assert r.status_code == 200
                assert r.headers["x-weight-staleness"] == "0" and r.headers["x-weight-version"] == "v2"
            assert b.stats.by_path["/v1/completions"] == before  # the v1 engine got none
            await c.post("/admin/pause", json={"engines": [a.url]})  # only b (v1) takes work
            r = await c.post("/v1/completions", json=BODY)  # no policy: any version
            assert (r.headers["x-weight-version"], r.headers["x-weight-staleness"]) == ("v1", "1")
            assert b.stats.by_path["/v1/completions"] == before + 1
            await c.post("/admin/resume", json={"engines": [a.url]})
            bad = await c.post("/v1/completions", json=BODY, headers={"X-Weight-Policy": "newest"})
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "X-Weight-Policy"
            text = (await c.get("/metrics")).text
            assert metric(text, "trioforward_answer_staleness_versions_count") >= 4
        assert a.stats.by_path["/v1/completions"] >= 4


async def test_admission_admin_calls_server_timing_and_metrics(fd_baseline: int) -> None:
    async with open_sim() as a, open_gateway(a.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            for bad, param in (({"tenant": "default", "step": 0, "eta": 1}, "step"),
                               ({"step": 4, "eta": 1}, "tenant"),
                               ({"tenant": "default", "step": 4, "eta": 1, "on_stale": "x"}, "on_stale")):
                refused = await c.post("/admin/staleness", json=bad)
                assert refused.status_code == 400 and param in refused.json()["error"]["message"]
            ok = await c.post("/admin/staleness", json={"tenant": "default", "step": 1, "eta": 0})
            assert ok.status_code == 201 and ok.json()["on_stale"] == "continue"
            answers: list[httpx.Response] = []
            async with trio.open_nursery() as nursery:
                async def one() -> None:
                    answers.append(await c.post("/v1/completions", json=BODY))

                nursery.start_soon(one)
                nursery.start_soon(one)
                with trio.fail_after(30):
                    while gw.state.client.admission.waiting != 1:
                        await gw.state.client.admission.wait_changed()
                    await a.stats.wait_for(lambda s: s.completed == 1)
                assert a.stats.by_path["/v1/completions"] == 1
                await c.post("/admin/resume", json={"weight_version": "v1"})
            late = [r for r in answers if "admission;dur=" in r.headers["server-timing"]]
            assert len(late) == 1 and a.stats.by_path["/v1/completions"] == 2
            (listed,) = (await c.get("/admin/staleness")).json()["bounds"]
            assert (listed["started"], listed["allowed"], listed["waiting"]) == (2, 2, 0)
            assert metric((await c.get("/metrics")).text, "trioforward_admission_wait_seconds_count") == 1
            gone = await c.request("DELETE", "/admin/staleness", json={"tenant": "default"})
            assert gone.status_code == 200
            again = await c.request("DELETE", "/admin/staleness", json={"tenant": "default"})
            assert again.status_code == 404


async def test_group_tail_in_the_abort_answer_and_on_metrics(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=5) as a, open_gateway(a.url, abort_grace=30.0) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            head = {"X-Rollout-Group": "step-1"}
            answers: list[httpx.Response] = []
            async with trio.open_nursery() as nursery:
                async def member(tokens: int) -> None:
                    answers.append(await c.post(
                        "/v1/completions", json={**BODY, "max_tokens": tokens}, headers=head
                    ))

                nursery.start_soon(member, 4000)  # the straggler
                nursery.start_soon(member, 2)  # answered first
                with trio.fail_after(30):
                    await a.stats.wait_for(lambda s: s.running == 1 and s.completed == 1)
                aborted = (await c.post("/admin/abort", json={"group": "step-1"})).json()
            tail = aborted["group_tail"]
            assert tail["members"] == 2 and 0 < tail["spread_s"] <= tail["last_s"]
            assert answers[1].json()["choices"][0]["finish_reason"] == "abort"
            text = (await c.get("/metrics")).text
            assert metric(text, "trioforward_group_last_seconds_count") == 1
            assert metric(text, "trioforward_group_spread_seconds_count") == 1


async def test_the_whole_update_through_the_gateway_on_a_mixed_fleet(fd_baseline: int) -> None:
    async with AsyncExitStack() as stack:
        s1 = await stack.enter_async_context(open_sim(kind="sglang", prefix_cache_tokens=4096))
        s2 = await stack.enter_async_context(open_sim(kind="sglang", prefix_cache_tokens=4096))
        v = await stack.enter_async_context(open_sim(kind="vllm", prefix_cache_tokens=4096))
        gw = await stack.enter_async_context(open_gateway(s1.url, s2.url, v.url))
        await kinds(gw)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            # 1. pause everything, 2. push to every engine of each kind, 3. resume with the
            # caches flushed: one call sequence, every call against the gateway.
            assert (await c.post("/admin/pause", json={"engine_mode": "abort"})).status_code == 200
            disk = await c.post("/update_weights_from_disk", json={"model_path": "/ckpt/2"})
            assert disk.status_code == 200, disk.text
            for path, body in (("/start_weight_update", {}), ("/update_weights", {"update_info": {}}),
                               ("/finish_weight_update", {})):
                assert (await c.post(path, json=body)).status_code == 200, path
            resumed = await c.post("/admin/resume", json={"weight_version": "v2", "flush_cache": True})
            assert resumed.status_code == 200, resumed.text
            flushed = {r["engine"]: r["success"] for r in resumed.json()["flushed"]}
            assert flushed == {s1.url: True, s2.url: True, v.url: True}
            assert s1.stats.by_path["/flush_cache"] == s2.stats.by_path["/flush_cache"] == 1
            assert v.stats.by_path["/reset_prefix_cache"] == 1
            assert not any(e["paused"] for e in (await c.get("/admin/engines")).json()["engines"])
            assert s1.model_path == s2.model_path == "/ckpt/2"

            # One engine failing the push: 207 names it, the other is rolled back, and the
            # trainer's resume (no version) leaves nothing paused on the old version.
            s2.faults.fail_weight_push = 1
            assert (await c.post("/admin/pause", json={"engine_mode": "abort"})).status_code == 200
            pushed = await c.post("/update_weights_from_disk", json={"model_path": "/ckpt/3"})
            assert pushed.status_code == 207 and s2.url in pushed.json()["message"]
            assert [r["engine"] for r in pushed.json()["rolled_back"]] == [s1.url]
            assert (await c.post("/admin/resume", json={})).status_code == 200
            assert not any(e["paused"] for e in (await c.get("/admin/engines")).json()["engines"])
            assert not s1.rl.paused and not s2.rl.paused and not v.rl.paused
            assert gw.state.client.weights.version == "v2"
            assert s1.model_path == s2.model_path == "/ckpt/2"
            ran = await c.post("/v1/completions", json=BODY)
            assert ran.status_code == 200 and ran.headers["x-weight-version"] == "v2"


async def test_a_tinker_sample_takes_the_policy_header(fd_baseline: int) -> None:
    async with open_sim() as a, open_sim() as b, open_gateway(a.url, b.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            await http.post("/admin/resume", json={"weight_version": "v1"})
            await http.post("/admin/pause", json={"engines": [b.url], "engine_mode": "abort"})
            await http.post("/admin/resume", json={"engines": [b.url], "weight_version": "v2"})
            r = await http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "x"})
            r = await http.post(
                "/api/v1/create_sampling_session",
                json={"session_id": r.json()["session_id"], "sampling_session_seq_id": 0, "base_model": "sim-base"},
            )
            sample = {
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]},
                "sampling_params": {"max_tokens": 2, "seed": 1},
                "sampling_session_id": r.json()["sampling_session_id"],
                "num_samples": 1,
            }
            bad = await http.post("/api/v1/asample", json={**sample, "seq_id": 0},
                                  headers={"X-Weight-Policy": "min_version="})
            assert bad.status_code == 400 and "X-Weight-Policy" in bad.text
            before = a.stats.by_path["/v1/completions"]
            for seq in range(1, 5):
                future = (await http.post("/api/v1/asample", json={**sample, "seq_id": seq},
                                          headers={"X-Weight-Policy": "latest"})).json()["request_id"]
                done = await http.post("/api/v1/retrieve_future", json={"request_id": future})
                assert done.status_code == 200
            assert a.stats.by_path["/v1/completions"] == before  # the v1 engine got none
            assert b.stats.by_path["/v1/completions"] == 4
