"""replay="continue" on /v1/chat/completions: an aborted chat answer continues through
the token form (docs/operations.md, "Which routes continue")."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from dispatch_testing import client_for

from trioforward.dispatch import ForwardResponse
from trioforward.sim import expected_completion, open_engine, render_text

CHAT = "/v1/chat/completions"
MODEL = "sim-base"
MESSAGES = [{"role": "user", "content": "hello"}]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "seed": 3, **extra}


async def update(client: Any, version: str) -> None:
    await client.pause(engine_mode="abort", replay="continue")
    await trio.sleep(30)
    await client.resume(weight_version=version)


async def run(engine: Any, client: Any, payload: dict[str, Any]) -> ForwardResponse:
    await client.resume(weight_version="v1")
    out: list[ForwardResponse] = []

    async def one() -> None:
        out.append(await client.post(CHAT, json=payload))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        await engine.stats.wait_for(lambda s: s.running == 1)
        await trio.sleep(0.45)  # 4 tokens under v1
        await update(client, "v2")
    return out[0]


async def test_a_chat_answer_continues_through_the_token_form(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        r = await run(
            engine, client, chat(n=2, logprobs=True, top_logprobs=2, return_token_ids=True)
        )
        doc = r.json()
        prompt = doc["prompt_token_ids"]
        assert r.status == 200 and r.weight_version == "v1, v2"
        for c in doc["choices"]:
            head, head_lp, _ = expected_completion(MODEL, prompt, 3, c["index"], 10)
            tail, tail_lp, _ = expected_completion(MODEL, prompt + head[:4], 3, 0, 6)
            assert c["token_ids"] == head[:4] + tail and c["finish_reason"] == "length"
            assert c["message"]["content"] == render_text(head[:4]) + render_text(tail)
            entries = c["logprobs"]["content"]
            assert [e["logprob"] for e in entries] == head_lp[:4] + tail_lp
            assert [e["token"] for e in entries] == [f" t{t}" for t in head[:4] + tail]
            assert all(len(e["top_logprobs"]) == 2 for e in entries)
            assert c["weight_versions"] == [
                {"version": "v1", "start": 0, "end": 4},
                {"version": "v2", "start": 4, "end": 10},
            ]
        assert doc["usage"]["completion_tokens"] == 20
        # Each choice decoded once: 2 x 10, the continuations on /v1/completions.
        assert engine.stats.tokens_decoded == 20
        assert engine.stats.by_path[CHAT] == 1 and engine.stats.by_path["/v1/completions"] == 2


async def test_a_caller_without_token_ids_gets_its_shape(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        plain = (await client.post(CHAT, json=chat())).json()
        assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None
        r = await run(engine, client, chat())
        doc = r.json()
        [c] = doc["choices"]
        assert doc["prompt_token_ids"] is None and c["token_ids"] is None
        assert len(c["message"]["content"].split()) == 10 and c["finish_reason"] == "length"
        assert [s["end"] for s in c["weight_versions"]] == [4, 10]
        assert engine.stats.tokens_decoded == 10 + 10


async def test_chat_with_tools_is_replayed_whole(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        tools = [{"type": "function", "function": {"name": "f"}}]
        r = await run(engine, client, chat(tools=tools))  # the engine parses the whole message
        [c] = r.json()["choices"]
        assert c["finish_reason"] == "length" and "weight_versions" not in c
        assert engine.stats.tokens_decoded == 4 + 10  # decoded again, whole
        assert client.continued.whole == 1 and client.continued.answers == 0


async def test_chat_without_a_budget_is_replayed_whole(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100, max_model_len=40) as engine,
        client_for(engine) as client,
    ):
        payload = chat()
        del payload["max_tokens"]  # what the model length leaves: not known to the gateway
        r = await run(engine, client, payload)
        [c] = r.json()["choices"]
        assert c["finish_reason"] == "length" and "weight_versions" not in c
        assert client.continued.whole == 1 and client.continued.answers == 0
