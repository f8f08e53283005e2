"""Every endpoint answers in vLLM's shapes, with the predicted tokens."""

from __future__ import annotations

import httpx
import orjson
import pytest
from simclient import Conn, request

from trioforward.sim import (
    SimEngine,
    expected_completion,
    expected_prompt_logprobs,
    expected_top_logprobs,
    open_engine,
    render_text,
    sample,
    tokenize,
)


async def test_health_and_models(engine: SimEngine) -> None:
    async with httpx.AsyncClient(base_url=engine.url) as client:
        health = await client.get("/health")
        assert health.status_code == 200 and health.content == b""
        models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert [(m["id"], m["parent"]) for m in models["data"]] == [
        ("sim-base", None),
        ("sim-base-2", None),
    ]
    assert engine.stats.by_path == {"/health": 1, "/v1/models": 1}
    assert engine.stats.requests == 2


async def test_completion_matches_the_prediction(engine: SimEngine) -> None:
    prompt = [3, 1, 4, 1, 5]
    body = {
        "model": "sim-base",
        "prompt": prompt,
        "max_tokens": 6,
        "seed": 42,
        "n": 2,
        "logprobs": 2,
        "prompt_logprobs": 1,
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(base_url=engine.url) as client:
        reply = (await client.post("/v1/completions", json=body)).json()
    assert reply["object"] == "text_completion" and reply["model"] == "sim-base"
    assert reply["usage"] == {
        "prompt_tokens": 5,
        "total_tokens": 17,
        "completion_tokens": 12,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    for index, choice in enumerate(reply["choices"]):
        tokens, logprobs, finish = expected_completion("sim-base", prompt, 42, index, 6)
        assert choice["index"] == index and choice["finish_reason"] == finish == "length"
        assert choice["token_ids"] == tokens and choice["prompt_token_ids"] == prompt
        assert choice["text"] == render_text(tokens)
        lp = choice["logprobs"]
        assert lp["token_logprobs"] == logprobs
        assert lp["tokens"] == [f" t{t}" for t in tokens]
        assert lp["top_logprobs"] == [
            expected_top_logprobs(t, x, 2) for t, x in zip(tokens, logprobs, strict=True)
        ]
        assert lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(f" t{tokens[0]}")
        assert choice["prompt_logprobs"] == expected_prompt_logprobs("sim-base", prompt, 1)
    assert engine.stats.completed == 1 and engine.stats.by_model == {"sim-base": 1}
    assert engine.stats.by_seed == {42: 1}


async def test_string_and_batched_prompts(engine: SimEngine) -> None:
    body = {
        "model": "sim-base-2",
        "prompt": ["ab", [7, 8]],
        "max_tokens": 3,
        "seed": 1,
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(base_url=engine.url) as client:
        reply = (await client.post("/v1/completions", json=body)).json()
    a, b = reply["choices"]
    assert a["prompt_token_ids"] == tokenize("ab") and b["prompt_token_ids"] == [7, 8]
    assert a["token_ids"] == expected_completion("sim-base-2", "ab", 1, 0, 3)[0]
    assert b["token_ids"] == expected_completion("sim-base-2", [7, 8], 1, 0, 3)[0]
    assert a["logprobs"] is None and "token_ids" in a


async def test_stop_token_ids_and_stop_strings(engine: SimEngine) -> None:
    full = expected_completion("sim-base", [1], 0, 0, 8)[0]
    async with httpx.AsyncClient(base_url=engine.url) as client:
        by_id = (
            await client.post(
                "/v1/completions",
                json={
                    "prompt": [1],
                    "max_tokens": 8,
                    "seed": 0,
                    "stop_token_ids": [full[4]],
                    "return_token_ids": True,
                },
            )
        ).json()["choices"][0]
        by_text = (
            await client.post(
                "/v1/completions",
                json={
                    "prompt": [1],
                    "max_tokens": 8,
                    "seed": 0,
                    "stop": f" t{full[2]}",
                },
            )
        ).json()["choices"][0]
    assert by_id["finish_reason"] == "stop" and by_id["stop_reason"] == full[4]
    assert by_id["token_ids"] == full[:5] and by_id["text"] == render_text(full[:4])
    assert by_text["finish_reason"] == "stop" and by_text["text"] == render_text(full[:2])


async def test_chat_completion(engine: SimEngine) -> None:
    messages = [{"role": "user", "content": "hi"}]
    body = {
        "model": "sim-base",
        "messages": messages,
        "max_tokens": 4,
        "logprobs": True,
        "top_logprobs": 1,
        "seed": 5,
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(base_url=engine.url) as client:
        reply = (await client.post("/v1/chat/completions", json=body)).json()
    prompt = tokenize("user: hi\n")
    tokens, logprobs, _ = expected_completion("sim-base", prompt, 5, 0, 4)
    choice = reply["choices"][0]
    assert reply["object"] == "chat.completion" and reply["prompt_token_ids"] == prompt
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == render_text(tokens)
    assert choice["token_ids"] == tokens
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == logprobs
    assert all(len(c["top_logprobs"]) == 1 for c in choice["logprobs"]["content"])


def _events(body: bytes) -> list[dict[str, object]]:
    chunks = [c for c in body.split(b"\n\n") if c]
    assert chunks[-1] == b"data: [DONE]"
    return [orjson.loads(c.removeprefix(b"data: ")) for c in chunks[:-1]]


@pytest.mark.parametrize("chat", [False, True])
async def test_streaming_equals_the_full_answer(engine: SimEngine, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base: dict[str, object] = {
        "model": "sim-base",
        "max_tokens": 5,
        "seed": 3,
        "n": 2,
        "return_token_ids": True,
    }
    base.update({"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": [4, 2]})
    async with httpx.AsyncClient(base_url=engine.url) as client:
        full = (await client.post(path, json=base)).json()
        streamed = await client.post(
            path, json={**base, "stream": True, "stream_options": {"include_usage": True}}
        )
    assert streamed.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = _events(streamed.content)
    counts = ("prompt_tokens", "total_tokens", "completion_tokens")
    assert events[-1]["usage"] == {k: full["usage"][k] for k in counts}  # no details, as vLLM
    assert events[-1]["choices"] == []
    for index in range(2):
        mine = [c for e in events[:-1] for c in e["choices"] if c["index"] == index]  # type: ignore[attr-defined]
        key = "delta" if chat else "text"
        text = "".join(c[key]["content"] if chat else c[key] for c in mine)
        expected = full["choices"][index]
        assert text == (expected["message"]["content"] if chat else expected["text"])
        assert [t for c in mine for t in c.get("token_ids") or []] == expected["token_ids"]
        assert mine[-1]["finish_reason"] == "length"
        assert all(c["finish_reason"] is None for c in mine[:-1])
    assert engine.stats.completed == 2


async def test_stream_never_sends_the_stop_string(engine: SimEngine) -> None:
    full = expected_completion("sim-base", [1], 0, 0, 8)[0]
    stop = f" t{full[1]} t{full[2]}"  # spans two tokens
    async with httpx.AsyncClient(base_url=engine.url) as client:
        streamed = await client.post(
            "/v1/completions",
            json={"prompt": [1], "max_tokens": 8, "seed": 0, "stop": [stop], "stream": True},
        )
    text = "".join(c["text"] for e in _events(streamed.content) for c in e["choices"])  # type: ignore[attr-defined]
    assert text == sample("sim-base", [1], 0, 0, 8, stop=[stop]).text == render_text(full[:1])


async def test_bad_requests_are_400_and_unknown_paths_404(engine: SimEngine) -> None:
    async with httpx.AsyncClient(base_url=engine.url) as client:
        assert (await client.post("/v1/completions", content=b"{nope")).status_code == 400
        bad = await client.post("/v1/completions", json={"prompt": [1], "max_tokens": -1})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
        assert (await client.post("/v1/completions", json={"prompt": {"a": 1}})).status_code == 400
        assert (await client.post("/v1/chat/completions", json={"messages": []})).status_code == 400
        assert (await client.get("/v1/completions")).status_code == 405
        missing = await client.get("/nope")
        assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
    assert engine.stats.responses[400] == 4 and engine.stats.completed == 0


async def test_unknown_model_is_vllm_not_found(engine: SimEngine) -> None:
    reply = await request(engine, "POST", "/v1/completions", {"model": "nobody", "prompt": [1]})
    assert reply.status == 404
    assert reply.json() == {
        "error": {
            "message": "The model `nobody` does not exist. Valid aliases: sim-base, sim-base-2.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    assert engine.stats.by_model == {"nobody": 1} and engine.stats.completed == 0


async def test_keep_alive_connection_serves_many_requests(engine: SimEngine) -> None:
    async with await Conn.open(engine) as conn:
        for i in range(5):
            reply = await conn.request("POST", "/v1/completions", {"prompt": [i], "max_tokens": 2})
            assert reply.status == 200
    await engine.stats.wait_for(lambda s: s.connections_open == 0)
    assert engine.stats.connections_accepted == 1 and engine.stats.completed == 5


async def test_sim_stats_and_faults_endpoints_are_not_counted(engine: SimEngine) -> None:
    await request(engine, "GET", "/health")
    stats = (await request(engine, "GET", "/sim/stats")).json()
    assert stats["requests"] == 1 and stats["by_path"] == {"/health": 1}
    assert stats["responses"] == {"200": 1}
    faults = await request(engine, "POST", "/sim/faults", {"reject": 2, "retry_after": 1.5})
    assert faults.status == 200 and faults.json()["reject"] == 2
    assert engine.faults.reject == 2 and engine.faults.retry_after == 1.5
    bad = await request(engine, "POST", "/sim/faults", {"no_such_fault": 1})
    assert bad.status == 400
    assert (await request(engine, "POST", "/sim/faults", {"drop": -1})).status == 400
    cleared = (await request(engine, "POST", "/sim/faults", {"reset": True})).json()
    assert cleared["reject"] == 0 and cleared["stall_seconds"] is None
    assert (await request(engine, "GET", "/sim/faults")).json() == cleared
    assert engine.stats.requests == 1
    await request(engine, "POST", "/sim/faults", {"reset_stats": True})
    assert engine.stats.requests == 0 and engine.stats.connections_accepted == 0


async def test_max_model_len_refuses_a_longer_prompt_and_cuts_a_longer_output(
    fd_baseline: int,
) -> None:
    async with open_engine(max_model_len=16) as engine:
        fits = await request(
            engine, "POST", "/v1/completions", {"prompt": list(range(10)), "max_tokens": 50}
        )
        assert fits.status == 200  # as vLLM: not an error, the output ends at the model length
        choice, usage = fits.json()["choices"][0], fits.json()["usage"]
        assert usage["completion_tokens"] == 6 and choice["finish_reason"] == "length"
        too_long = await request(engine, "POST", "/v1/completions", {"prompt": list(range(17))})
        assert too_long.status == 400
        error = too_long.json()["error"]
        assert error["param"] == "input_tokens" and "maximum context length is 16" in error["message"]
        assert engine.stats.completed == 1
