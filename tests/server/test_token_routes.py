"""POST /generate (SGLang) and POST /inference/v1/generate (vLLM) through the gateway
(docs/server.md, "Token routes")."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import trio
from gateway_harness import open_gateway, open_sim

GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}}
TOK = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 3}}


async def kinds(gw: Any) -> None:
    client = gw.app.extensions["trioforward"].client
    with trio.fail_after(10):
        for e in client.engines.list():
            await client.engines.wait_kind(e.url)


async def direct(engine: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient() as c:
        return await c.post(engine.url + path, json=body)


async def test_generate_goes_to_sglang_only_and_answers_as_sglang(fd_baseline: int) -> None:
    async with (
        open_sim(kind="sglang") as sglang,
        open_sim() as vllm,
        open_gateway(vllm.url, sglang.url, routing="round-robin") as gw,
    ):
        await kinds(gw)
        async with httpx.AsyncClient(base_url=gw.url) as c:
            for _ in range(3):
                r = await c.post("/generate", json={**GEN, "rid": "mine"})
                assert r.status_code == 200
                want = (await direct(sglang, "/generate", {**GEN, "rid": "mine"})).json()
                got = r.json()
                assert got["output_ids"] == want["output_ids"] and got["meta_info"]["id"] == "mine"
                assert got["meta_info"]["weight_versions"] == want["meta_info"]["weight_versions"]
            nobody = await c.post("/inference/v1/generate", json=TOK)
            assert nobody.status_code == 404
            error = nobody.json()["error"]
            assert error["code"] == "route_not_served" and "/inference/v1/generate" in error["message"]
            bad = await c.post("/generate", json={"input_ids": [], "sampling_params": {}})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_ids"
            bad = await c.post("/generate", json={**GEN, "stream": "yes"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "stream"
            budget = {"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}
            bad = await c.post("/generate", json=budget)
            assert bad.json()["error"]["param"] == "sampling_params.max_new_tokens"
            # SGLang's own refusal comes back verbatim
            seed = await c.post("/generate", json={"input_ids": [1], "sampling_params": {"seed": 1}})
            assert seed.status_code == 400 and seed.json()["error"].startswith("unknown field `seed`")
        assert sglang.stats.by_path["/generate"] == 3 + 3 + 1
        assert vllm.stats.by_path["/generate"] == 0


async def test_each_attempt_has_a_fresh_rid_and_the_caller_keeps_its_own(fd_baseline: int) -> None:
    async with open_sim(kind="sglang") as engine, open_gateway(engine.url, rejection_retries=1) as gw:
        await kinds(gw)
        engine.faults.update({"paths": ["/generate"], "reject": 1, "reject_status": 503})
        async with httpx.AsyncClient(base_url=gw.url) as c:
            r = await c.post("/generate", json={**GEN, "rid": "same"})
            again = await c.post("/generate", json={**GEN, "rid": "same"})  # not in flight: fine
        assert r.status_code == 200 and r.json()["meta_info"]["id"] == "same"
        assert again.status_code == 200
        assert engine.stats.by_path["/generate"] == 3  # the rejected attempt, its retry, again


async def test_cumulative_streams_are_relayed_whole_events(fd_baseline: int) -> None:
    async with open_sim(kind="sglang") as engine, open_gateway(engine.url) as gw:
        await kinds(gw)
        async with httpx.AsyncClient(base_url=gw.url) as c:
            r = await c.post("/generate", json={**GEN, "stream": True, "rid": "s1"})
        want = (await direct(engine, "/generate", {**GEN, "stream": True, "rid": "s1"})).content
        assert r.status_code == 200 and r.content == want


async def test_vllm_token_route_through_the_gateway_as_direct(fd_baseline: int) -> None:
    async with open_sim(scale_out=True) as engine, open_sim() as plain, open_gateway(plain.url, engine.url) as gw:
        await kinds(gw)
        body = {**TOK, "request_id": "abc", "sampling_params": {"max_tokens": 3, "logprobs": 1}}
        async with httpx.AsyncClient(base_url=gw.url) as c:
            got = (await c.post("/inference/v1/generate", json=body)).json()
            stream = await c.post("/inference/v1/generate", json={**body, "stream": True})
        want = (await direct(engine, "/inference/v1/generate", body)).json()
        assert got["request_id"] == "generate-tokens-abc" == want["request_id"]
        assert got["choices"] == want["choices"]
        events = [orjson.loads(e[6:]) for e in stream.content.split(b"\n\n") if e and e != b"data: [DONE]"]
        assert sum((e["choices"][0]["token_ids"] for e in events), []) == want["choices"][0]["token_ids"]
        assert {e["request_id"] for e in events} == {"generate-tokens-abc"}
        assert plain.stats.by_path["/inference/v1/generate"] == 1  # only the kind detection's POST {} (403: off)


async def test_token_routes_take_the_api_key(fd_baseline: int) -> None:
    async with open_sim(kind="sglang") as engine, open_gateway(engine.url, api_keys=("k1",)) as gw:
        await kinds(gw)
        async with httpx.AsyncClient(base_url=gw.url) as c:
            assert (await c.post("/generate", json=GEN)).status_code == 401
            ok = await c.post("/generate", json=GEN, headers={"Authorization": "Bearer k1"})
            assert ok.status_code == 200
        assert engine.stats.by_path["/generate"] == 1


async def test_generate_refuses_a_rid_list_that_does_not_fit_the_prompts(fd_baseline: int) -> None:
    # One prompt with a list rid (SGLang: 400 since its fix, 500 before) or a batch
    # whose rid list has another length: 400 in SGLang's error shape
    # (error.message), nothing sent to the engine, no internal id anywhere.
    async with open_sim(kind="sglang") as engine, open_gateway(engine.url) as gw:
        await kinds(gw)
        before = engine.stats.by_path["/generate"]
        bodies = [
            {**GEN, "rid": ["a", "b"]},
            {**GEN, "text": "hello", "input_ids": None, "rid": ["a"]},
            {**GEN, "input_ids": [[1, 2], [3]], "rid": ["a", "b", "c"]},
            {**GEN, "rid": 7},
        ]
        async with httpx.AsyncClient(base_url=gw.url) as c:
            for body in bodies:
                body = {k: v for k, v in body.items() if v is not None}
                r = await c.post("/generate", json=body)
                direct_answer = await direct(engine, "/generate", body)
                assert r.status_code == 400 == direct_answer.status_code, (body, r.text)
                error = r.json()["error"]
                assert error["param"] == "rid" and isinstance(error["message"], str)
                assert isinstance(direct_answer.json()["error"]["message"], str)
                assert r.headers["x-request-id"] not in r.text  # no internal id leaks
            ok = await c.post("/generate", json={**GEN, "input_ids": [[1, 2], [3]], "rid": ["a", "b"]})
        assert ok.status_code == 200 and [i["meta_info"]["id"] for i in ok.json()] == ["a", "b"]
        assert engine.stats.by_path["/generate"] - before == len(bodies) + 1  # the direct ones and the batch
        assert await gw.pool_active() == 0
