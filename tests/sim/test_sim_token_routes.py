"""The sim's token routes: SGLang's /generate (kind "sglang") held to the SGLang
reference (docs/compatibility.md, "SGLang engines") and vLLM's
/inference/v1/generate (scale_out) to vLLM 0.32's token_in_token_out protocol."""

from __future__ import annotations

import orjson
import trio
import trio.testing
from simclient import Reply, request
from vllm_probes import FIXTURES

from trioforward.sim import expected_completion, open_engine


def events(reply: Reply) -> list[object]:
    parts = [p for p in reply.body.split(b"\n\n") if p]
    assert parts[-1] == b"data: [DONE]"
    return [orjson.loads(p.removeprefix(b"data: ")) for p in parts[:-1]]


async def test_sglang_generate_single_batch_and_n(fd_baseline: int) -> None:
    async with open_engine(kind="sglang") as engine:
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}, "rid": "r1", "return_logprob": True}
        one = (await request(engine, "POST", "/generate", body)).json()
        tokens, logprobs, _ = expected_completion("sim-base", [1, 2, 3], None, 0, 3)
        assert one["output_ids"] == tokens
        meta = one["meta_info"]
        assert meta["id"] == "r1" and meta["finish_reason"] == {"type": "length", "length": 3}
        assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 3
        assert meta["output_token_logprobs"] == [[lp, t, None] for t, lp in zip(tokens, logprobs, strict=False)]
        assert meta["weight_version"] == "default"
        assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 3}]
        batch = {"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 2}, "rid": "b"}
        items = (await request(engine, "POST", "/generate", batch)).json()
        assert [i["meta_info"]["id"] for i in items] == ["b_0", "b_1"]
        n2 = {"input_ids": [5], "sampling_params": {"max_new_tokens": 2, "n": 2, "sampling_seed": 7}}
        samples = (await request(engine, "POST", "/generate", n2)).json()
        assert len(samples) == 2 and len({s["meta_info"]["id"] for s in samples}) == 2
        assert samples[1]["output_ids"] == expected_completion("sim-base", [5], 7, 1, 2)[0]


async def test_sglang_generate_errors_have_its_shapes(fd_baseline: int) -> None:
    async with open_engine(kind="sglang") as engine:
        seed = await request(engine, "POST", "/generate", {"input_ids": [1], "sampling_params": {"seed": 1}})
        assert seed.status == 400 and seed.json()["error"].startswith("unknown field `seed`")
        kind = await request(engine, "POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 2.5}})
        assert kind.json() == {"error": "invalid type: floating point `2.5`, expected i64"}
        empty = await request(engine, "POST", "/generate", {"input_ids": []})
        assert empty.status == 400 and empty.json() == {"error": {"message": "input_ids cannot be empty."}}
        lora = await request(engine, "POST", "/generate", {"input_ids": [1], "lora_path": "a9"})
        assert "never been loaded: a9" in lora.json()["error"]["message"]
        assert (await request(engine, "POST", "/abort_request", {"rid": "nobody"})).body == b""


async def test_sglang_generate_has_all_four_error_shapes(fd_baseline: int) -> None:
    """docs/compatibility.md, "SGLang engines": the contract's plain string, the
    tokenizer's {"error": {"message"}}, the validation / HTTP-exception object, and
    in a stream one error event under 200."""
    async with open_engine(kind="sglang", max_model_len=16) as engine:
        validation = await request(engine, "POST", "/generate", {"input_ids": [1], "return_routed_experts": [1]})
        error = validation.json()
        assert validation.status == 400 and set(error) == {"object", "message", "type", "param", "code"}
        assert error["object"] == "error" and error["type"] == "Bad Request" and error["code"] == 400
        assert "return_routed_experts" in error["message"] and error["param"] is None
        lax = await request(engine, "POST", "/generate", {"input_ids": [1], "return_routed_experts": "yes"})
        assert lax.status == 200  # pydantic's lax bool
        long = {"input_ids": [1] * 20, "stream": True}
        stream = await request(engine, "POST", "/generate", long)
        assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
        (event,) = events(stream)
        assert event == {
            "error": {
                "message": "The input (20 tokens) is longer than the model's context length (16 tokens).",
                "type": "invalid_request_error",
                "code": 400,
                "retryable": False,
            }
        }
        whole = await request(engine, "POST", "/generate", {"input_ids": [1] * 20})
        assert whole.status == 400 and set(whole.json()["error"]) == {"message"}
        over = {"input_ids": [1] * 10, "sampling_params": {"max_new_tokens": 7}}
        too_many = await request(engine, "POST", "/generate", over)
        assert too_many.status == 400
        assert too_many.json()["error"]["message"].startswith("Requested token count exceeds the model's maximum")
        engine.faults.update({"paths": ["/generate"], "reject": 1, "reject_status": 503})
        busy = await request(engine, "POST", "/generate", {"input_ids": [1]})
        assert busy.status == 503 and busy.json()["type"] == "503" and busy.json()["object"] == "error"
        assert engine.stats.by_path["/generate"] == 6 and engine.stats.rejected == 1


async def test_sglang_openai_routes_name_adapters_base_colon_adapter(fd_baseline: int) -> None:
    async with open_engine(kind="sglang", lora_modules={"a1": "/adapters/a1"}) as engine:
        body = {"prompt": [1, 2, 3], "max_tokens": 3, "return_token_ids": True}
        bare = (await request(engine, "POST", "/v1/completions", {**body, "model": "a1"})).json()
        named = (await request(engine, "POST", "/v1/completions", {**body, "model": "sim-base:a1"})).json()
        anything = (await request(engine, "POST", "/v1/completions", {**body, "model": "whatever"})).json()
        assert bare["model"] == "a1" and named["model"] == "sim-base:a1"  # echoed as asked
        assert bare["choices"][0]["token_ids"] == expected_completion("sim-base", [1, 2, 3], None, 0, 3)[0]
        assert named["choices"][0]["token_ids"] == expected_completion("a1", [1, 2, 3], None, 0, 3)[0]
        assert anything["choices"][0]["token_ids"] == bare["choices"][0]["token_ids"]  # base, no 404
        assert engine.stats.by_model["a1"] == 1 and engine.stats.by_model["sim-base"] == 2
        missing = await request(engine, "POST", "/v1/completions", {**body, "model": "sim-base:a9"})
        assert missing.status == 400
        assert missing.json() == {
            "object": "error",
            "message": "Got LoRA adapter that has never been loaded: a9",
            "type": "BadRequest",
            "param": None,
            "code": 400,
        }
        bad = await request(engine, "POST", "/v1/completions", {**body, "max_tokens": "x"})
        assert bad.status == 400 and bad.json()["object"] == "error" and "error" not in bad.json()


async def test_sglang_streams_are_cumulative(fd_baseline: int) -> None:
    async with open_engine(kind="sglang") as engine:
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}, "stream": True}
        chunks = events(await request(engine, "POST", "/generate", body))
        tokens = expected_completion("sim-base", [1, 2], None, 0, 3)[0]
        assert [c["output_ids"] for c in chunks] == [tokens[:1], tokens[:2], tokens]  # type: ignore[index]
        assert [c["meta_info"]["finish_reason"] for c in chunks][:2] == [None, None]  # type: ignore[index]


async def test_sglang_abort_by_prefix_answers_the_tokens_so_far(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine(kind="sglang", decode_ms_per_token=100) as engine:
        replies: list[Reply] = []

        async def one() -> None:
            body = {"input_ids": [1], "sampling_params": {"max_new_tokens": 50}, "rid": "abc123"}
            replies.append(await request(engine, "POST", "/generate", body))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.55)
            dup = await request(engine, "POST", "/generate", {"input_ids": [1], "rid": "abc123"})
            assert dup.json() == {"error": {"message": "Duplicate request ID detected: abc123"}}
            await request(engine, "POST", "/abort_request", {"rid": "abc"})
        answer = replies[0].json()
        assert answer["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(answer["output_ids"]) < 50


async def test_vllm_token_route_only_with_scale_out(fd_baseline: int) -> None:
    async with open_engine() as plain, open_engine(scale_out=True) as engine:
        # Off, vLLM 0.32 answers the path 403 "Scale-out endpoints are disabled" (and
        # GET 405), as recorded: neither answer tells whether the route is served.
        off = await request(plain, "POST", "/inference/v1/generate", {})
        assert off.status == 403 and off.json()["error"]["type"] == "PermissionDeniedError"
        assert (await request(plain, "GET", "/inference/v1/generate")).status == 405
        assert (await request(engine, "GET", "/inference/v1/generate")).status == 405
        body = {"token_ids": [1, 2, 3], "request_id": "x", "sampling_params": {"max_tokens": 3, "logprobs": 1}}
        answer = (await request(engine, "POST", "/inference/v1/generate", body)).json()
        tokens, logprobs, _ = expected_completion("sim-base", [1, 2, 3], None, 0, 3)
        assert answer["request_id"] == "generate-tokens-x" and answer["output_mode"] == "tokens"
        choice = answer["choices"][0]
        assert choice["token_ids"] == tokens and choice["finish_reason"] == "length"
        assert [c["logprob"] for c in choice["logprobs"]["content"]] == logprobs
        # vLLM's engine core starts at version "default" (recorded: tokens_generate)
        assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": 3}]
        await request(engine, "POST", "/update_weight_version", {"new_version": "v1"})
        choice = (await request(engine, "POST", "/inference/v1/generate", body)).json()["choices"][0]
        assert choice["weight_versions"] == [{"version": "v1", "start": 0, "end": 3}]
        bad = await request(engine, "POST", "/inference/v1/generate", {"token_ids": [], "sampling_params": {}})
        assert bad.status == 400 and bad.json()["error"]["param"] == "body.token_ids"
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        chunks = events(await request(engine, "POST", "/inference/v1/generate", stream))
        deltas = [c["choices"][0]["token_ids"] for c in chunks[:-1]]  # type: ignore[index]
        assert sum(deltas, []) == tokens and chunks[-1]["usage"]["completion_tokens"] == 3  # type: ignore[index]
        assert (await request(engine, "POST", "/inference/v1/abort_requests", {})).status == 400


async def test_vllm_token_route_without_max_tokens_runs_to_the_model_length(fd_baseline: int) -> None:
    # As vLLM 0.32 answered (tests/sim/vllm_0_32_fixtures/tokens_generate_no_max_tokens.json:
    # a 4-token prompt, model length 256, 252 tokens), not /v1/completions' 16.
    recorded = orjson.loads(
        (FIXTURES / "tokens_generate_no_max_tokens.json").read_bytes()
    )["body"]["usage"]
    assert (recorded["prompt_tokens"], recorded["completion_tokens"]) == (4, 252)
    async with open_engine(scale_out=True, max_model_len=256) as engine:
        for params in ({"temperature": 0}, {"max_tokens": None}):
            body = {"token_ids": [0, 1, 2, 3], "sampling_params": params}
            doc = (await request(engine, "POST", "/inference/v1/generate", body)).json()
            [choice] = doc["choices"]
            assert len(choice["token_ids"]) == 252 and choice["finish_reason"] == "length"
            assert doc["usage"]["completion_tokens"] == recorded["completion_tokens"]
        assert engine.stats.tokens_decoded == 2 * 252
    async with open_engine(scale_out=True) as engine:  # no model length: docs/sim.md's 2048
        body = {"token_ids": [0, 1, 2, 3], "sampling_params": {}}
        doc = (await request(engine, "POST", "/inference/v1/generate", body)).json()
        assert len(doc["choices"][0]["token_ids"]) == 2048 - 4


async def test_vllm_completions_take_a_boolean_logprobs_as_vllm_does(fd_baseline: int) -> None:
    # vLLM 0.32 (completion_logprobs_true / _false.json): true is logprobs 1, false is 0.
    for name, flag in (("completion_logprobs_true", True), ("completion_logprobs_false", False)):
        recorded = orjson.loads((FIXTURES / f"{name}.json").read_bytes())
        assert recorded["status"] == 200
        assert len(recorded["body"]["choices"][0]["logprobs"]["token_logprobs"]) == 3
        async with open_engine() as engine:
            base = {"model": "sim-base", "prompt": [1, 2, 3], "max_tokens": 3, "seed": 5}
            got = await request(engine, "POST", "/v1/completions", {**base, "logprobs": flag})
            same = await request(engine, "POST", "/v1/completions", {**base, "logprobs": int(flag)})
            assert got.status == 200, got.body
            assert got.json()["choices"][0]["logprobs"] == same.json()["choices"][0]["logprobs"]
            if not flag:  # logprobs 0: the sampled token's alone
                assert all(len(t) == 1 for t in got.json()["choices"][0]["logprobs"]["top_logprobs"])
