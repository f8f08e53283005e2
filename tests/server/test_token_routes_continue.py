"""POST /generate and POST /inference/v1/generate through the gateway across an abort
weight update with replay "continue": one answer in the route's shape, the caller's
ids kept (docs/operations.md, "Which routes continue")."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import trio
from gateway_harness import open_gateway, open_sim


async def kinds(gw: Any) -> None:
    client = gw.state.client
    with trio.fail_after(10):
        for e in client.engines.list():
            await client.engines.wait_kind(e.url)


BUDGET = 300  # 3 s of decoding: the pause lands mid-generation on a loaded machine too


def route_body(path: str, **extra: Any) -> dict[str, Any]:
    """A token route's body of :data:`BUDGET` tokens with the caller's id ``mine``."""
    if path == "/generate":
        params = {"max_new_tokens": BUDGET}
        return {"input_ids": [1, 2, 3], "sampling_params": params, "rid": "mine", **extra}
    params = {"max_tokens": BUDGET}
    return {"token_ids": [1, 2, 3], "sampling_params": params, "request_id": "mine", **extra}


async def across_an_update(c: httpx.AsyncClient, engine: Any, call: Any) -> None:
    """Run ``call()`` while an abort pause with continue lands mid-generation (v1 -> v2)."""
    assert (await c.post("/admin/resume", json={"weight_version": "v1"})).status_code == 200
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await engine.stats.wait_for(lambda s: s.tokens_decoded >= 3)
        paused = await c.post("/admin/pause", json={"engine_mode": "abort", "replay": "continue"})
        assert paused.status_code == 200, paused.text
        assert (await c.post("/admin/resume", json={"weight_version": "v2"})).status_code == 200


@pytest.mark.parametrize("path", ["/generate", "/inference/v1/generate"])
async def test_a_token_route_continued_through_the_gateway_keeps_the_callers_id(
    fd_baseline: int, path: str
) -> None:
    sglang = path == "/generate"
    options = {"kind": "sglang"} if sglang else {"scale_out": True}
    budget = BUDGET
    body = route_body(path)
    async with (
        open_sim(decode_ms_per_token=10, **options) as engine,
        open_gateway(engine.url) as gw,
    ):
        await kinds(gw)
        out: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

            async def one() -> None:
                out.append(await c.post(path, json=body))

            await across_an_update(c, engine, one)
        [r] = out
        assert r.status_code == 200 and r.headers["x-weight-version"] == "v1, v2"
        doc = r.json()
        if sglang:
            ids, spans = doc["output_ids"], doc["meta_info"]["weight_versions"]
            assert doc["meta_info"]["id"] == "mine"
        else:
            ids, spans = doc["choices"][0]["token_ids"], doc["choices"][0]["weight_versions"]
            assert doc["request_id"] == "generate-tokens-mine"
        assert len(ids) == budget
        assert [s["version"] for s in spans] == ["v1", "v2"]
        assert (
            spans[0]["start"] == 0
            and spans[0]["end"] == spans[1]["start"]
            and spans[1]["end"] == budget
        )
        assert engine.stats.tokens_decoded == budget  # nothing decoded twice
        assert await gw.pool_active() == 0


async def test_a_continued_vllm_token_request_without_max_tokens_gets_no_fresh_default(
    fd_baseline: int,
) -> None:
    # vLLM 0.32's token route runs a request with no max_tokens to the model length
    # (tests/sim/vllm_0_32_fixtures/tokens_generate_no_max_tokens.json); continued
    # with prompt + tokens so far and still no max_tokens, it ends at the same
    # total: never the tokens so far plus a fresh default.
    max_model_len, prompt = 303, [1, 2, 3]
    body = {"token_ids": prompt, "sampling_params": {}, "request_id": "mine"}
    async with (
        open_sim(decode_ms_per_token=10, scale_out=True, max_model_len=max_model_len) as engine,
        open_gateway(engine.url) as gw,
    ):
        await kinds(gw)
        detected = engine.stats.by_path["/inference/v1/generate"]  # the kind detection's POST {}
        out: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            assert (await c.post("/admin/resume", json={"weight_version": "v1"})).status_code == 200

            async def one() -> None:
                out.append(await c.post("/inference/v1/generate", json=body))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                await engine.stats.wait_for(lambda s: s.tokens_decoded >= 3)
                paused = await c.post(
                    "/admin/pause", json={"engine_mode": "abort", "replay": "continue"}
                )
                assert paused.status_code == 200, paused.text
                assert (
                    await c.post("/admin/resume", json={"weight_version": "v2"})
                ).status_code == 200
        [r] = out
        assert r.status_code == 200 and r.headers["x-weight-version"] == "v1, v2"
        [choice] = r.json()["choices"]
        assert len(choice["token_ids"]) == max_model_len - len(prompt)
        assert choice["finish_reason"] == "length"
        assert [s["version"] for s in choice["weight_versions"]] == ["v1", "v2"]
        # The first attempt and one continuation:
        assert engine.stats.by_path["/inference/v1/generate"] - detected == 2
        assert engine.stats.tokens_decoded == max_model_len - len(prompt)  # nothing decoded twice
        assert await gw.pool_active() == 0


@pytest.mark.parametrize("path", ["/generate", "/inference/v1/generate"])
async def test_tokens_decoded_before_any_version_was_recorded_are_labelled_default_on_every_route(
    fd_baseline: int, path: str
) -> None:
    # No version recorded yet, then a continue pause and a resume to "v1": the
    # first segment's span is "default" on every route — what SGLang and vLLM's
    # token route call the weights they started with — never null; the header
    # names the same two ("default, v1"). /v1/completions and client.complete():
    # tests/dispatch/test_dispatch_continue.py.
    sglang = path == "/generate"
    options: dict[str, Any] = {"kind": "sglang"} if sglang else {"scale_out": True}
    budget = 300
    if sglang:
        body: dict[str, Any] = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": budget}}
    else:
        body = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": budget}}
    async with (
        open_sim(decode_ms_per_token=10, **options) as engine,
        open_gateway(engine.url) as gw,
    ):
        await kinds(gw)
        out: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

            async def one() -> None:
                out.append(await c.post(path, json=body))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                await engine.stats.wait_for(lambda s: s.tokens_decoded >= 3)
                paused = await c.post(
                    "/admin/pause", json={"engine_mode": "abort", "replay": "continue"}
                )
                assert paused.status_code == 200, paused.text
                resumed = await c.post("/admin/resume", json={"weight_version": "v1"})
                assert resumed.status_code == 200
        [r] = out
        assert r.status_code == 200 and r.headers["x-weight-version"] == "default, v1"
        doc = r.json()
        spans = doc["meta_info"]["weight_versions"] if sglang else doc["choices"][0]["weight_versions"]
        assert [s["version"] for s in spans] == ["default", "v1"]
        assert spans[-1]["end"] == budget
        assert await gw.pool_active() == 0


@pytest.mark.parametrize("path", ["/generate", "/inference/v1/generate"])
async def test_a_token_route_stream_continued_through_the_gateway_keeps_the_callers_id(
    fd_baseline: int, path: str
) -> None:
    sglang, budget = path == "/generate", BUDGET
    options = {"kind": "sglang"} if sglang else {"scale_out": True}
    async with (
        open_sim(decode_ms_per_token=10, **options) as engine,
        open_gateway(engine.url) as gw,
    ):
        await kinds(gw)
        data: list[bytes] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

            async def one() -> None:
                async with c.stream("POST", path, json=route_body(path, stream=True)) as r:
                    assert r.status_code == 200
                    data.extend([chunk async for chunk in r.aiter_bytes()])

            await across_an_update(c, engine, one)
        text = b"".join(data)
        assert text.endswith(b"data: [DONE]\n\n") and b'"abort"' not in text
        events = [orjson.loads(e[6:]) for e in text.split(b"\n\n") if e and e != b"data: [DONE]"]
        if sglang:
            ids, spans = events[-1]["output_ids"], events[-1]["meta_info"]["weight_versions"]
            assert {e["meta_info"]["id"] for e in events} == {"mine"}
        else:
            ids = [t for e in events for c in e["choices"] for t in c["token_ids"]]
            spans = events[-1]["choices"][0]["weight_versions"]
            assert {e["request_id"] for e in events} == {"generate-tokens-mine"}
        assert len(ids) == budget
        assert [s["version"] for s in spans] == ["v1", "v2"] and spans[1]["end"] == budget
        assert engine.stats.tokens_decoded == budget  # nothing decoded twice
        assert await gw.pool_active() == 0
