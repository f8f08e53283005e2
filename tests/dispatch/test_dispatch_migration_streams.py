"""Streams whose engine dies mid-answer go on on another engine through the one
stream continue loop: the engines' own token routes (SGLang ``/generate``, vLLM
``/inference/v1/generate``) as the OpenAI routes, and a continuation whose own
engine dies (docs/operations.md, "Migration")."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for
from test_dispatch_continue_native import MODEL, PROMPT, SGLANG, VLLM, routed
from test_dispatch_continue_native_stream import events_of

from trioforward.sim import SimEngine, expected_completion, open_engine, render_text

BUDGET = 10
SEED = 3


def split_at(tokens: list[int], prompt: list[int], index: int) -> int:
    """The ``k`` for which ``tokens`` is choice ``index``'s first ``k`` tokens, then
    what an engine samples for prompt + those ``k`` (none lost, none repeated);
    asserts there is one, with ``0 < k < BUDGET``."""
    head = expected_completion(MODEL, prompt, SEED, index, BUDGET)[0]
    fits = [
        k
        for k in range(1, BUDGET)
        if tokens == head[:k] + expected_completion(MODEL, prompt + head[:k], SEED, 0, BUDGET - k)[0]
    ]
    assert len(fits) == 1, (tokens, fits)
    return fits[0]


def route_body(path: str, n: int) -> dict[str, Any]:
    if path == SGLANG:
        params = {"max_new_tokens": BUDGET, "sampling_seed": SEED}
        return {"input_ids": PROMPT, "sampling_params": params, "stream": True}
    params = {"max_tokens": BUDGET, "seed": SEED, "n": n}
    return {"token_ids": PROMPT, "model": MODEL, "sampling_params": params, "stream": True}


def choices_of(path: str, data: bytes, n: int) -> list[list[int]]:
    """Each choice's tokens as the caller read them."""
    events = events_of(data)
    if path == SGLANG:  # each event has every token so far
        assert [len(e["output_ids"]) for e in events] == list(range(1, BUDGET + 1))
        assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
        return [events[-1]["output_ids"]]
    out = []
    for index in range(n):
        mine = [c for e in events for c in e["choices"] if c["index"] == index]
        assert mine[-1]["finish_reason"] == "length"
        assert all(c["finish_reason"] is None for c in mine[:-1])
        out.append([t for c in mine for t in c["token_ids"]])
    return out


async def read(client: Any, path: str, chunks: list[bytes], **kwargs: Any) -> None:
    """Stream ``path`` through ``client`` into ``chunks``."""
    async with client.stream(path, **kwargs) as fs:
        assert fs.status == 200
        async for chunk in fs.aiter_bytes():
            chunks.append(chunk)


@pytest.mark.parametrize(("path", "n"), [(SGLANG, 1), (VLLM, 1), (VLLM, 2)])
async def test_a_token_route_stream_migrates_off_a_dying_engine(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, path: str, n: int
) -> None:
    options: dict[str, Any] = {"kind": "sglang"} if path == SGLANG else {"scale_out": True}
    async with (
        open_engine(decode_ms_per_token=100, **options) as dying,
        open_engine(decode_ms_per_token=100, **options) as survivor,
        client_for(dying, max_migrations=1) as client,
    ):
        await client.engines.wait_kind(dying.url)
        await client.resume(weight_version="v1")
        survivor.rl.weight_version = "v1"
        chunks: list[bytes] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(read, client, path, chunks, **routed(path, route_body(path, n))))
            await dying.stats.wait_for(lambda s: s.running == 1)
            client.engines.add(survivor.url)
            await client.engines.wait_kind(survivor.url)
            detection = survivor.stats.by_path[path]  # the kind probe's
            await trio.sleep(0.45)  # about 4 tokens
            await dying.stop_listening()  # the engine dies: its connections with it
        got = choices_of(path, b"".join(chunks), n)
        ks = [split_at(tokens, PROMPT, index) for index, tokens in enumerate(got)]
        # Engine side: one continuation per choice on the survivor, which decoded
        # only what the dead engine had not relayed.
        assert survivor.stats.by_path[path] - detection == n
        assert survivor.stats.tokens_decoded == sum(BUDGET - k for k in ks)
        assert client.statistics().migrations == {(path, "broken"): 1}


async def test_a_continuation_whose_engine_dies_migrates_again(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    """The stream's engine dies, then its continuation's: each piece goes on from
    the tokens relayed so far, on an engine that has not failed it."""
    async with (
        open_engine(decode_ms_per_token=100) as first,
        open_engine(decode_ms_per_token=100) as second,
        open_engine(decode_ms_per_token=100) as third,
        client_for(first, max_migrations=2) as client,
    ):
        await client.resume(weight_version="v1")
        second.rl.weight_version = third.rl.weight_version = "v1"
        payload = body(prompt=PROMPT, max_tokens=BUDGET, seed=SEED, stream=True)
        chunks: list[bytes] = []

        async def dies(engine: SimEngine) -> None:
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.35)  # about 3 tokens
            await engine.stop_listening()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(read, client, COMPLETION, chunks, json=payload))
            client.engines.add(second.url)
            await dies(first)
            client.engines.add(third.url)  # after: the first migration went to second
            await dies(second)
        text = "".join(c["text"] for e in events_of(b"".join(chunks)) for c in e["choices"])
        [at_second] = second.stats.prompts
        [at_third] = third.stats.prompts
        k1, k2 = len(at_second) - len(PROMPT), len(at_third) - len(at_second)
        assert k1 > 0 and k2 > 0 and k1 + k2 < BUDGET
        head = expected_completion(MODEL, PROMPT, SEED, 0, BUDGET)[0][:k1]
        middle = expected_completion(MODEL, PROMPT + head, SEED, 0, BUDGET - k1)[0][:k2]
        assert at_second == PROMPT + head and at_third == PROMPT + head + middle
        tail = expected_completion(MODEL, at_third, SEED, 0, BUDGET - k1 - k2)[0]
        assert text == render_text(head + middle + tail)  # every token once, in order
        assert [e.stats.by_path[COMPLETION] for e in (first, second, third)] == [1, 1, 1]
        assert client.statistics().migrations == {(COMPLETION, "broken"): 2}
