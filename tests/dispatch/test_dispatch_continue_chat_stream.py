"""replay="continue" on a /v1/chat/completions stream: held open through the pause and
continued through the token form, never relaying the engine's abort
(docs/operations.md, "Which routes continue")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio
import trio.testing
from dispatch_testing import client_for

from trioforward.sim import expected_completion, open_engine, render_text

CHAT = "/v1/chat/completions"
MODEL = "sim-base"
MESSAGES = [{"role": "user", "content": "hello"}]


async def update(client: Any, version: str) -> None:
    await client.pause(engine_mode="abort", replay="continue")
    await trio.sleep(30)  # the weights are pushed
    await client.resume(weight_version=version)


def events_of(data: bytes) -> list[dict[str, Any]]:
    assert data.endswith(b"data: [DONE]\n\n") and data.count(b"[DONE]") == 1
    parts = [e for e in data.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in parts)
    return [orjson.loads(e[6:]) for e in parts[:-1]]


async def streamed(engine: Any, client: Any, payload: dict[str, Any]) -> bytes:
    """The bytes of one chat stream that an abort + continue pause crosses after
    4 tokens under v1."""
    await client.resume(weight_version="v1")
    chunks: list[bytes] = []

    async def read() -> None:
        async with client.stream(CHAT, json=payload) as fs:
            chunks.extend([chunk async for chunk in fs.aiter_bytes()])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await engine.stats.wait_for(lambda s: s.running == 1)
        await trio.sleep(0.45)  # 4 tokens under v1
        await update(client, "v2")
    return b"".join(chunks)


@pytest.mark.parametrize("n", [1, 2])
async def test_a_chat_stream_continues_across_an_abort_pause(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, n: int
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        payload = {
            "model": MODEL, "messages": MESSAGES, "max_tokens": 10, "seed": 3, "n": n,
            "stream": True, "logprobs": True, "top_logprobs": 2,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
        }  # fmt: skip
        data = await streamed(engine, client, payload)
        assert b"abort" not in data
        events = events_of(data)
        *deltas, usage = events
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10 * n
        assert {e["object"] for e in events} == {"chat.completion.chunk"}
        assert len({e["id"] for e in events}) == 1
        prompt = deltas[0]["prompt_token_ids"]
        for index in range(n):
            mine = [c for e in deltas for c in e["choices"] if c["index"] == index]
            head, head_lp, _ = expected_completion(MODEL, prompt, 3, index, 10)
            tail, tail_lp, _ = expected_completion(MODEL, prompt + head[:4], 3, 0, 6)
            assert [t for c in mine for t in c.get("token_ids") or []] == head[:4] + tail
            text = "".join(c["delta"].get("content") or "" for c in mine)
            assert text == render_text(head[:4]) + render_text(tail)
            entries = [e for c in mine if c["logprobs"] for e in c["logprobs"]["content"]]
            assert [e["logprob"] for e in entries] == head_lp[:4] + tail_lp
            assert all(len(e["top_logprobs"]) == 2 for e in entries)
            assert all(c["finish_reason"] is None for c in mine[:-1])
            assert mine[-1]["finish_reason"] == "length"
            assert mine[-1]["weight_versions"] == [
                {"version": "v1", "start": 0, "end": 4},
                {"version": "v2", "start": 4, "end": 10},
            ]
        # Each choice decoded once; the continuations went to /v1/completions.
        assert engine.stats.tokens_decoded == 10 * n
        assert engine.stats.by_path[CHAT] == 1 and engine.stats.by_path["/v1/completions"] == n
        assert client.continued.answers == 1 and client.continued.continuations == n


async def test_a_caller_without_token_ids_gets_its_shape(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        payload = {"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "seed": 3,
                   "stream": True}  # fmt: skip
        data = await streamed(engine, client, payload)
        assert b"abort" not in data
        choices = [c for e in events_of(data) for c in e["choices"]]
        assert all(c.get("token_ids") is None for c in choices)
        assert all(e.get("prompt_token_ids") is None for e in events_of(data))
        assert choices[-1]["finish_reason"] == "length"
        assert engine.stats.tokens_decoded == 10


async def test_a_chat_stream_that_cannot_continue_ends_with_an_error_not_an_abort(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # No budget: vLLM gives chat what the model length leaves, which a completion
    # continuation cannot know. The stream ends with an error, never "abort".
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        payload = {"model": MODEL, "messages": MESSAGES, "seed": 3, "stream": True}
        await client.resume(weight_version="v1")
        chunks: list[bytes] = []
        failed: list[Exception] = []

        async def read() -> None:
            try:
                async with client.stream(CHAT, json=payload) as fs:
                    async for chunk in fs.aiter_bytes():
                        chunks.append(chunk)
            except Exception as exc:  # the dispatch error the server writes as an event
                failed.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await update(client, "v2")
        assert failed and "cannot be continued" in str(failed[0])
        assert b"abort" not in b"".join(chunks)
        assert engine.stats.by_path.get("/v1/completions", 0) == 0


async def test_a_chat_stream_ended_in_prefill_is_sent_again_whole(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # The pause lands before the first token: the engine's abort events are all the
    # stream had, with no prompt ids to continue from. Nothing went to the caller
    # yet, so the chat request is sent again and its stream relayed instead.
    async with (
        open_engine(decode_ms_per_token=100, prefill_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        payload = {"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "seed": 3,
                   "stream": True}  # fmt: skip
        chunks: list[bytes] = []

        async def read() -> None:
            async with client.stream(CHAT, json=payload) as fs:
                chunks.extend([chunk async for chunk in fs.aiter_bytes()])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await update(client, "v2")
        data = b"".join(chunks)
        assert b"abort" not in data
        choices = [c for e in events_of(data) for c in e["choices"]]
        assert choices[0]["delta"] == {"role": "assistant", "content": ""}
        assert [c["finish_reason"] for c in choices].count("length") == 1
        assert engine.stats.pause_aborted == 1 and engine.stats.by_path[CHAT] == 2
        assert engine.stats.tokens_decoded == 10 and client.continued.whole == 1
