"""The engines' own abort routes through the gateway, by the caller's ids: SGLang's
``POST /abort_request {"rid" | "abort_all"}`` and vLLM's ``POST
/inference/v1/abort_requests {"request_ids"}`` (docs/server.md, "Token routes")."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import trio
from gateway_harness import open_gateway, open_sim

LONG = 4000  # tokens: a generation only an abort ends within the test
KEYS = {"a": "sk-tenant-a-0123456789", "b": "sk-tenant-b-9876543210"}
TENANTS = {"a": {"keys": [KEYS["a"]]}, "b": {"keys": [KEYS["b"]]}}


async def until(predicate: Any) -> None:
    """Return once ``predicate()`` holds (the sim's decode loop never lets every task
    block, so it is polled)."""
    with trio.fail_after(60):  # a hang guard only
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


async def kinds(gw: Any) -> None:
    client = gw.state.client
    with trio.fail_after(10):
        for e in client.engines.list():
            await client.engines.wait_kind(e.url)


def gen(rid: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": LONG}, **extra}
    if rid is not None:
        body["rid"] = rid
    return body


async def post(
    http: httpx.AsyncClient, out: dict[str, Any], key: str, path: str, body: Any, headers: Any = None
) -> None:
    out[key] = await http.post(path, json=body, headers=headers)


async def test_sglang_abort_request_by_rid_queued_running_unknown_and_all(fd_baseline: int) -> None:
    async with open_sim(kind="sglang", decode_ms_per_token=5) as engine, open_gateway(
        engine.url, engine_capacity=3, abort_grace=30.0
    ) as gw:
        await kinds(gw)
        client = gw.state.client
        out: dict[str, Any] = {}
        async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http, trio.open_nursery() as nursery:
            nursery.start_soon(post, http, out, "a", "/generate", gen("a"))
            nursery.start_soon(post, http, out, "b", "/generate", gen("b"))
            nursery.start_soon(post, http, out, "batch", "/generate", gen("t", input_ids=[[1, 2], [3, 4]]))
            await until(lambda: engine.stats.running == 3)
            decoded = engine.stats.tokens_decoded  # a few steps each: "a" has tokens to give back
            await engine.stats.wait_for(lambda s: s.tokens_decoded >= decoded + 12)
            nursery.start_soon(post, http, out, "q", "/generate", gen("q"))
            await until(lambda: client.statistics().queued == 1)
            sent = engine.stats.by_path["/abort_request"]
            queued = await http.post("/abort_request", json={"rid": "q"})
            assert queued.status_code == 200 and engine.stats.by_path["/abort_request"] == sent
            one = await http.post("/abort_request", json={"rid": "a"})
            assert one.status_code == 200 and one.content == b""
            assert engine.stats.by_path["/abort_request"] == sent + 1  # one engine-side id
            await until(lambda: "a" in out)
            item = await http.post("/abort_request", json={"rid": "t_1"})  # an item of a batch
            assert item.status_code == 200
            for unknown in ({"rid": "nobody"}, {"rid": ""}, {}):
                nothing = await http.post("/abort_request", json=unknown)
                assert nothing.status_code == 200 and nothing.content == b""
            assert "b" not in out  # runs on
            every = await http.post("/abort_request", json={"abort_all": True})
            assert every.status_code == 200
        got = out["a"].json()
        assert got["meta_info"]["id"] == "a"  # the caller's id, not the engine-side one
        assert got["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(got["output_ids"]) < LONG
        batch = out["batch"].json()
        assert [i["meta_info"]["finish_reason"]["type"] for i in batch] == ["abort", "abort"]
        assert [i["meta_info"]["id"] for i in batch] == ["t_0", "t_1"]
        # Never reached an engine: SGLang's waiting-queue answer.
        waiting = out["q"].json()
        assert waiting["output_ids"] == [] and waiting["meta_info"]["id"] == "q"
        assert waiting["meta_info"]["finish_reason"]["type"] == "abort"
        assert out["b"].json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert engine.stats.by_path["/generate"] == 3  # "q" never reached it
        assert engine.stats.pause_aborted == 3  # a, the batch (one generation), b
        assert await gw.pool_active() == 0
        assert client.statistics().in_flight == 0 and not gw.state.extras["native_callers"].by_id


async def test_vllm_abort_requests_by_request_id_header_body_and_answer_name(fd_baseline: int) -> None:
    async with open_sim(scale_out=True, decode_ms_per_token=5) as engine, open_gateway(
        engine.url, abort_grace=30.0
    ) as gw:
        await kinds(gw)
        out: dict[str, Any] = {}
        path = "/inference/v1/generate"
        tok = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": LONG}}
        async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http, trio.open_nursery() as nursery:
            nursery.start_soon(post, http, out, "h", path, tok, {"X-Request-Id": "by-header"})
            nursery.start_soon(post, http, out, "b", path, {**tok, "request_id": "by-body"})
            nursery.start_soon(post, http, out, "c", path, {**tok, "request_id": "stays"})
            await until(lambda: engine.stats.running == 3)
            # running counts a generation before its first decode step: wait for
            # about three steps each, so every aborted answer has tokens to give back
            decoded = engine.stats.tokens_decoded
            await engine.stats.wait_for(lambda s: s.tokens_decoded >= decoded + 9)
            bad = await http.post("/inference/v1/abort_requests", json={})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "request_ids"
            ids = ["by-header", "generate-tokens-by-body", "unknown"]
            done = await http.post("/inference/v1/abort_requests", json={"request_ids": ids})
            assert done.status_code == 200 and done.content == b""
            assert "content-type" not in done.headers  # as vLLM answers it (recorded)
            await until(lambda: "h" in out and "b" in out)
            assert "c" not in out
            await http.post("/inference/v1/abort_requests", json={"request_ids": ["stays"]})
        for key, rid in (("h", "by-header"), ("b", "by-body"), ("c", "stays")):
            body = out[key].json()
            assert body["request_id"] == f"generate-tokens-{rid}"
            (choice,) = body["choices"]
            assert choice["finish_reason"] == "abort" and 0 < len(choice["token_ids"]) < LONG
        assert engine.stats.pause_aborted == 3
        assert engine.stats.by_path["/abort_requests"] == 2  # one call per abort (its dev-mode route first)
        assert await gw.pool_active() == 0


async def test_a_tenant_aborts_its_own_requests_only(fd_baseline: int) -> None:
    async with open_sim(kind="sglang", decode_ms_per_token=5) as engine, open_gateway(
        engine.url, tenants=TENANTS, abort_grace=30.0
    ) as gw:
        await kinds(gw)
        out: dict[str, Any] = {}
        auth = {t: {"Authorization": f"Bearer {k}"} for t, k in KEYS.items()}
        async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http, trio.open_nursery() as nursery:
            nursery.start_soon(post, http, out, "a", "/generate", gen("same"), auth["a"])
            nursery.start_soon(post, http, out, "b", "/generate", gen("same-b"), auth["b"])
            await until(lambda: engine.stats.running == 2)
            assert (await http.post("/abort_request", json={"rid": "same"})).status_code == 401
            sent = engine.stats.by_path["/abort_request"]
            other = await http.post("/abort_request", json={"rid": "same"}, headers=auth["b"])
            assert other.status_code == 200
            again = await http.post("/abort_request", json={"abort_all": True}, headers=auth["a"])
            assert again.status_code == 200
            await until(lambda: "a" in out)
            assert "b" not in out and engine.stats.by_path["/abort_request"] == sent + 1
            await http.post("/abort_request", json={"abort_all": True}, headers=auth["b"])
        assert out["a"].json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert out["b"].json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert engine.stats.pause_aborted == 2


async def test_a_queued_stream_aborted_by_rid_ends_in_its_route_shape(fd_baseline: int) -> None:
    async with (
        open_sim(kind="sglang", decode_ms_per_token=5) as engine,
        open_sim(scale_out=True, decode_ms_per_token=5) as vllm,
        open_gateway(engine.url, vllm.url, engine_capacity=1, abort_grace=30.0) as gw,
    ):
        await kinds(gw)
        client = gw.state.client
        out: dict[str, Any] = {}
        tok = {"token_ids": [1, 2], "sampling_params": {"max_tokens": LONG}}
        async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http, trio.open_nursery() as nursery:
            nursery.start_soon(post, http, out, "run", "/generate", gen("run"))
            nursery.start_soon(post, http, out, "vrun", "/inference/v1/generate", {**tok, "request_id": "vrun"})
            await until(lambda: engine.stats.running == 1 and vllm.stats.running == 1)
            nursery.start_soon(post, http, out, "q", "/generate", gen("q", stream=True, input_ids=[[1], [2]]))
            nursery.start_soon(
                post, http, out, "vq", "/inference/v1/generate", {**tok, "request_id": "vq", "stream": True}
            )
            await until(lambda: client.statistics().queued == 2)
            await http.post("/abort_request", json={"rid": "q"})
            await http.post("/inference/v1/abort_requests", json={"request_ids": ["vq"]})
            await until(lambda: "q" in out and "vq" in out)
            await http.post("/abort_request", json={"abort_all": True})
            await http.post("/inference/v1/abort_requests", json={"request_ids": ["vrun"]})
        events = [e for e in out["q"].content.split(b"\n\n") if e]
        assert out["q"].status_code == 200 and events[-1] == b"data: [DONE]"
        items = [orjson.loads(e[6:]) for e in events[:-1]]
        assert [(i["index"], i["meta_info"]["id"], i["output_ids"]) for i in items] == [(0, "q_0", []), (1, "q_1", [])]
        assert {i["meta_info"]["finish_reason"]["type"] for i in items} == {"abort"}
        vevents = [e for e in out["vq"].content.split(b"\n\n") if e]
        assert vevents[-1] == b"data: [DONE]"
        (choice,) = orjson.loads(vevents[0][6:])["choices"]
        assert orjson.loads(vevents[0][6:])["request_id"] == "generate-tokens-vq"
        assert choice["finish_reason"] == "abort" and choice["token_ids"] == []
        assert engine.stats.by_path["/generate"] == 1 and vllm.stats.by_path["/inference/v1/generate"] == 2  # + the kind probe
