"""replay="continue" on the engines' own token routes: SGLang ``/generate`` and vLLM
``/inference/v1/generate`` continued in their own shapes (docs/operations.md,
"Which routes continue")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio
import trio.testing
from dispatch_testing import client_for

from trioforward.dispatch import ForwardResponse
from trioforward.sim import expected_completion, open_engine

PROMPT = [1, 2, 3]
OTHER = [4, 5, 6, 7]
MODEL = "sim-base"
SGLANG = "/generate"
VLLM = "/inference/v1/generate"


def continued(
    prompt: list[int], first: int, total: int, index: int = 0, seed: int = 3
) -> tuple[list[int], list[float]]:
    """The sim's tokens of a generation aborted after ``first`` tokens, continued once."""
    head, head_lp, _ = expected_completion(MODEL, prompt, seed, index, total)
    tail, tail_lp, _ = expected_completion(MODEL, prompt + head[:first], seed, 0, total - first)
    return head[:first] + tail, head_lp[:first] + tail_lp


def routed(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The keywords sending ``body`` as the gateway's token route does
    (server/proxy/_native.py): to engines of the route's kind, SGLang with a fresh
    ``rid`` per attempt."""
    kind = "sglang" if path == SGLANG else "vllm"
    content = orjson.dumps(body)

    def render(engine: Any, engine_id: str) -> tuple[str, bytes]:
        if kind == "sglang":
            return path, orjson.dumps({**body, "rid": engine_id})
        return path, content

    return {
        "content": content,
        "only": lambda e: e.kind == kind and bool(e.token_route),
        "render": render,
    }


async def native(client: Any, path: str, body: dict[str, Any]) -> ForwardResponse:
    """``body`` sent as the gateway's token route sends it (:func:`routed`)."""
    return await client.request("POST", path, **routed(path, body))


async def update(client: Any, version: str) -> None:
    await client.pause(engine_mode="abort", replay="continue")
    await trio.sleep(30)  # the weights are pushed
    await client.resume(weight_version=version)


async def run(
    engine: Any, client: Any, path: str, bodies: list[dict[str, Any]], steps: int = 4
) -> list[ForwardResponse]:
    """Send ``bodies`` at once, abort-update with continue after ``steps`` decode steps."""
    await client.engines.wait_kind(engine.url)
    await client.resume(weight_version="v1")
    out: list[ForwardResponse] = []

    async def one(body: dict[str, Any]) -> None:
        out.append(await native(client, path, body))

    async with trio.open_nursery() as nursery:
        for body in bodies:
            nursery.start_soon(one, body)
        await engine.stats.wait_for(lambda s: s.running == len(bodies))
        await trio.sleep(steps * 0.1 + 0.05)
        await update(client, "v2")
    return out


SPLIT = [{"version": "v1", "start": 0, "end": 4}, {"version": "v2", "start": 4, "end": 10}]


async def test_sglang_generate_is_continued_in_its_own_shape(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100, kind="sglang") as engine,
        client_for(engine) as client,
    ):
        body = {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 10, "sampling_seed": 3},
            "return_logprob": True,
        }
        [r] = await run(engine, client, SGLANG, [body])
        assert r.status == 200 and r.attempts == 2 and r.weight_version == "v1, v2"
        doc = r.json()
        tokens, logprobs = continued(PROMPT, 4, 10)
        assert doc["output_ids"] == tokens
        meta = doc["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 10
        assert [e[0] for e in meta["output_token_logprobs"]] == logprobs
        assert [e[1] for e in meta["output_token_logprobs"]] == tokens
        assert meta["weight_versions"] == SPLIT and meta["weight_version"] == "v2"
        assert meta["prompt_tokens"] == 3
        assert doc["text"] == "".join(f" t{t}" for t in tokens)
        # Decoded once: the 4 tokens of the first segment were kept, not decoded again.
        assert engine.stats.tokens_decoded == 10 and engine.stats.by_path[SGLANG] == 2
        assert client.continued.answers == 1 and client.continued.tokens_kept == 4


async def test_sglang_batch_n2_and_default_budget(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100, kind="sglang") as engine,
        client_for(engine) as client,
    ):
        # A batch of two prompts, 2 samples each, no max_new_tokens: SGLang's 128, pinned.
        body = {"input_ids": [PROMPT, OTHER], "sampling_params": {"n": 2, "sampling_seed": 3}}
        [r] = await run(engine, client, SGLANG, [body])
        items = r.json()
        assert isinstance(items, list) and len(items) == 4
        for k, item in enumerate(items):
            prompt = [PROMPT, OTHER][k // 2]
            tokens, _ = continued(prompt, 4, 128, k % 2)
            assert item["output_ids"] == tokens
            assert item["meta_info"]["finish_reason"]["type"] == "length"
            assert item["meta_info"]["weight_versions"] == [
                {"version": "v1", "start": 0, "end": 4},
                {"version": "v2", "start": 4, "end": 128},
            ]
        assert engine.stats.tokens_decoded == 4 * 128 and engine.stats.by_path[SGLANG] == 1 + 4


async def test_vllm_inference_generate_is_continued_in_its_own_shape(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100, scale_out=True) as engine,
        client_for(engine) as client,
    ):
        body = {
            "token_ids": PROMPT,
            "model": MODEL,
            "sampling_params": {"max_tokens": 10, "seed": 3, "logprobs": 1, "n": 2},
        }
        [r] = await run(engine, client, VLLM, [body])
        assert r.status == 200 and r.weight_version == "v1, v2"
        doc = r.json()
        assert [c["index"] for c in doc["choices"]] == [0, 1]
        for c in doc["choices"]:
            tokens, logprobs = continued(PROMPT, 4, 10, c["index"])
            assert c["token_ids"] == tokens and c["finish_reason"] == "length"
            assert [e["logprob"] for e in c["logprobs"]["content"]] == logprobs
            assert [e["token_id"] for e in c["logprobs"]["content"]] == tokens
            assert c["weight_versions"] == SPLIT
        assert doc["usage"]["prompt_tokens"] == 3 and doc["usage"]["completion_tokens"] == 20
        assert doc["usage"]["total_tokens"] == 23
        # The kind detection's POST {}, the request, one continuation per choice.
        assert engine.stats.tokens_decoded == 20 and engine.stats.by_path[VLLM] == 1 + 1 + 2


@pytest.mark.parametrize("path", [SGLANG, VLLM])
async def test_two_updates_during_one_generation(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, path: str
) -> None:
    options = {"kind": "sglang"} if path == SGLANG else {"scale_out": True}
    async with (
        open_engine(decode_ms_per_token=100, **options) as engine,
        client_for(engine) as client,
    ):
        budget = "max_new_tokens" if path == SGLANG else "max_tokens"
        key = "input_ids" if path == SGLANG else "token_ids"
        body = {key: PROMPT, "sampling_params": {budget: 20}}
        await client.engines.wait_kind(engine.url)
        await client.resume(weight_version="v1")
        out: list[ForwardResponse] = []

        async def one() -> None:
            out.append(await native(client, path, body))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.35)  # 3 tokens under v1
            await update(client, "v2")
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.55)  # 5 more under v2
            await update(client, "v3")
        doc = out[0].json()
        ids, spans = (
            (doc["output_ids"], doc["meta_info"]["weight_versions"])
            if path == SGLANG
            else (doc["choices"][0]["token_ids"], doc["choices"][0]["weight_versions"])
        )
        assert len(ids) == 20 and out[0].attempts == 3
        assert spans == [
            {"version": "v1", "start": 0, "end": 3},
            {"version": "v2", "start": 3, "end": 8},
            {"version": "v3", "start": 8, "end": 20},
        ]
        assert engine.stats.tokens_decoded == 20


async def test_sglang_continuation_refused_over_the_context_length_ends_with_length(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100, kind="sglang", max_model_len=13) as engine,
        client_for(engine) as client,
    ):
        await client.engines.wait_kind(engine.url)
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 10}}
        out: list[ForwardResponse] = []

        async def one() -> None:
            out.append(await native(client, SGLANG, body))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await client.pause(engine_mode="abort", replay="continue")
            engine.max_model_len = engine.adapters.max_model_len = 5  # 3 + 4 no longer fits
            await client.resume(weight_version="v2")
        doc = out[0].json()
        assert out[0].status == 200 and len(doc["output_ids"]) == 4
        assert doc["meta_info"]["finish_reason"]["type"] == "length"
        assert engine.stats.tokens_decoded == 4


async def test_a_request_with_nothing_generated_goes_whole(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100, kind="sglang", capacity=1) as engine,
        client_for(engine) as client,
    ):
        await client.engines.wait_kind(engine.url)
        await client.resume(weight_version="v1")
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 10, "sampling_seed": 3}}
        out: list[ForwardResponse] = []

        async def one() -> None:
            out.append(await native(client, SGLANG, body))

        async with trio.open_nursery() as nursery:
            for _ in range(2):  # the second waits in the engine's own queue
                nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1 and s.queued == 1)
            await trio.sleep(0.45)
            await update(client, "v2")
        spans = sorted(
            tuple(s["version"] for s in r.json()["meta_info"]["weight_versions"]) for r in out
        )
        assert spans == [("v1", "v2"), ("v2",)]
        whole = next(r.json() for r in out if len(r.json()["meta_info"]["weight_versions"]) == 1)
        assert whole["output_ids"] == expected_completion(MODEL, PROMPT, 3, 0, 10)[0]
        assert engine.stats.tokens_decoded == 20
