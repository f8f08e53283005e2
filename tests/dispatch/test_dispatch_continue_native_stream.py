"""replay="continue" on the token routes' streams: SGLang ``/generate`` and vLLM
``/inference/v1/generate`` with ``"stream": true`` go on across an abort pause in
their own event shapes, token by token, nothing decoded twice (docs/operations.md,
"Which routes continue")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from dispatch_testing import client_for
from test_dispatch_continue_native import (
    MODEL,
    PROMPT,
    SGLANG,
    VLLM,
    continued,
    routed,
    update,
)

from trioforward.sim import open_engine

SPLIT = [{"version": "v1", "start": 0, "end": 4}, {"version": "v2", "start": 4, "end": 10}]


def events_of(data: bytes) -> list[dict[str, Any]]:
    assert data.endswith(b"data: [DONE]\n\n") and data.count(b"[DONE]") == 1
    parts = [e for e in data.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in parts)
    return [orjson.loads(e[6:]) for e in parts[:-1]]


@asynccontextmanager
async def serving(path: str) -> AsyncIterator[tuple[Any, Any]]:
    """A simulated engine serving ``path`` (100 ms per decode step) and a client on it."""
    options = {"kind": "sglang"} if path == SGLANG else {"scale_out": True}
    async with open_engine(decode_ms_per_token=100, **options) as engine, client_for(engine) as client:
        yield engine, client


async def streamed(
    engine: Any, client: Any, path: str, body: dict[str, Any], steps: int = 4
) -> tuple[bytes, list[int]]:
    """``body`` streamed as the gateway's token route streams it (server/proxy/_native.py),
    abort-updated with continue after ``steps`` decode steps: the bytes, and the
    engine's ``tokens_decoded`` as each chunk arrived."""
    await client.engines.wait_kind(engine.url)
    await client.resume(weight_version="v1")
    chunks: list[bytes] = []
    decoded_at: list[int] = []

    async def read() -> None:
        async with client.stream(path, **routed(path, body)) as fs:
            assert fs.status == 200
            async for chunk in fs.aiter_bytes():
                chunks.append(chunk)
                decoded_at.append(engine.stats.tokens_decoded)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await engine.stats.wait_for(lambda s: s.running == 1)
        await trio.sleep(steps * 0.1 + 0.05)
        await update(client, "v2")
    return b"".join(chunks), decoded_at


async def test_an_sglang_stream_goes_on_with_every_token_so_far_in_each_event(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(SGLANG) as (engine, client):
        body = {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 10, "sampling_seed": 3},
            "return_logprob": True,
            "stream": True,
            "rid": "mine",
        }
        data, _ = await streamed(engine, client, SGLANG, body)
        items = events_of(data)
        tokens, logprobs = continued(PROMPT, 4, 10)
        assert all(i["meta_info"]["finish_reason"] is None for i in items[:-1])
        # Each event has every token so far, growing one step at a time across the seam.
        for item in items:
            n = len(item["output_ids"])
            assert item["output_ids"] == tokens[:n] and item["meta_info"]["completion_tokens"] == n
            assert [e[0] for e in item["meta_info"]["output_token_logprobs"]] == logprobs[:n]
            assert item["text"] == "".join(f" t{t}" for t in tokens[:n])
        assert [len(i["output_ids"]) for i in items] == list(range(1, 11))
        last = items[-1]["meta_info"]
        assert last["finish_reason"]["type"] == "length" and last["weight_versions"] == SPLIT
        # The caller's engine-side id stays (the gateway's route puts the caller's back).
        assert len({i["meta_info"]["id"] for i in items}) == 1
        assert all("weight_versions" not in i["meta_info"] for i in items[:-1])
        assert engine.stats.tokens_decoded == 10 and engine.stats.by_path[SGLANG] == 2
        assert client.continued.answers == 1 and client.continued.tokens_kept == 4


@pytest.mark.parametrize("n", [1, 2])
async def test_a_vllm_token_stream_goes_on_token_by_token(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, n: int
) -> None:
    async with serving(VLLM) as (engine, client):
        body = {
            "token_ids": PROMPT,
            "model": MODEL,
            "sampling_params": {"max_tokens": 10, "seed": 3, "logprobs": 1, "n": n},
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        data, decoded_at = await streamed(engine, client, VLLM, body)
        *deltas, usage = events_of(data)
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10 * n
        assert usage["usage"]["prompt_tokens"] == 3
        assert len({e["request_id"] for e in deltas + [usage]}) == 1
        for index in range(n):
            mine = [c for e in deltas for c in e["choices"] if c["index"] == index]
            tokens, logprobs = continued(PROMPT, 4, 10, index)
            assert [t for c in mine for t in c["token_ids"]] == tokens  # once each, in order
            assert [e["logprob"] for c in mine for e in c["logprobs"]["content"]] == logprobs
            assert all(c["finish_reason"] is None for c in mine[:-1])
            assert mine[-1]["finish_reason"] == "length" and mine[-1]["weight_versions"] == SPLIT
            assert all(c["weight_versions"] is None for c in mine[:-1])
            assert sum(1 for c in mine if c["token_ids"]) == 10  # one event per token
        # The continuation's tokens reached the reader while the engine still decoded.
        assert min(decoded_at) < 10 * n
        # The kind detection's POST {}, the stream, one continuation per choice.
        assert engine.stats.tokens_decoded == 10 * n and engine.stats.by_path[VLLM] == 1 + 1 + n


async def test_a_token_stream_with_a_text_prompt_relays_the_engines_abort(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(SGLANG) as (engine, client):
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 10}, "stream": True}
        data, _ = await streamed(engine, client, SGLANG, body)
        items = events_of(data)
        # No prompt ids to continue from: the engine's own abort event, as SGLang sends it.
        assert items[-1]["meta_info"]["finish_reason"]["type"] == "abort"
        assert engine.stats.by_path[SGLANG] == 1 and client.continued.answers == 0
