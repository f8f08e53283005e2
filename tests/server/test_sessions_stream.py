"""Streamed session turns (docs/sessions.md, "Streamed turns"): chat chunks as the
chat route streams them, the turn recorded when the engine's stream completes,
tool calls in the last delta, and a stream the client leaves recording nothing."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio
import trio.testing
from gateway_harness import Gateway

from trioforward.sim import render_text, tokenize

TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]
SCRIPT = 'Looking.<tool_call>{"name": "grep", "arguments": {"pattern": "def main"}}</tool_call>'


async def test_streamed_turns_record_what_was_sampled_and_end_with_the_tool_call(
    gateway: Gateway, engine: Any
) -> None:
    from openai import AsyncOpenAI

    async with httpx.AsyncClient(base_url=gateway.url) as admin:  # a version to label spans
        assert (await admin.post("/admin/resume", json={"weight_version": "v1"})).status_code == 200
    sdk = AsyncOpenAI(
        base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
        default_headers={"X-Session-Id": "streamed"},
    )  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": "find main"}]
    streams: list[list[Any]] = []
    async with sdk:
        for turn in range(2):
            if turn == 1:
                engine.replies.append(SCRIPT)
            stream = await sdk.chat.completions.create(
                model="sim-base", messages=messages, tools=TOOLS, max_tokens=120 if turn else 6,
                stream=True, logprobs=True, extra_body={"return_token_ids": True},
            )  # fmt: skip
            chunks = [chunk async for chunk in stream]
            streams.append(chunks)
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            content = "".join(d.content or "" for d in deltas)
            calls = [call for d in deltas for call in d.tool_calls or []]
            messages.append(
                {"role": "assistant", "content": content or None}
                | (
                    {"tool_calls": [c.model_dump(exclude={"index"}) for c in calls]}
                    if calls
                    else {}
                )
            )
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "main.py:1"})
            if not calls:
                messages.append({"role": "user", "content": "and the tool?"})
        # A third turn, not streamed, extends the streamed ones.
        third = await sdk.chat.completions.create(
            model="sim-base", messages=messages, tools=TOOLS, max_tokens=3,
            extra_body={"return_token_ids": True},
        )  # fmt: skip
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        trajectory = (await client.get("/v1/sessions/streamed")).json()
    turns = trajectory["turns"]
    assert len(turns) == 3 and trajectory["branch_points"] == []
    prompts, sampled = list(engine.stats.prompts), list(engine.stats.sampled)
    assert [t["prompt_token_ids"] for t in turns] == prompts
    assert [[t["token_ids"]] for t in turns] == sampled
    for k, chunks in enumerate(streams):
        first, *rest = chunks
        assert first.choices[0].delta.role == "assistant"
        assert first.model_extra["prompt_token_ids"] == prompts[k]
        assert first.model_extra["session"] == {"id": "streamed", "turn": k, "branch": False}
        ids = [i for c in rest if c.choices for i in c.choices[0].model_extra["token_ids"] or []]
        assert ids == turns[k]["token_ids"]  # every sampled token, in the chunks
        lps = [e.logprob for c in rest if c.choices for e in c.choices[0].logprobs.content]
        assert lps == turns[k]["logprobs"]
        last = rest[-1].choices[0]
        assert last.model_extra["weight_versions"] == turns[k]["weight_versions"]
        assert turns[k]["weight_versions"] == [{"version": "v1", "start": 0, "end": len(ids)}]
    plain = streams[0]
    assert "".join(c.choices[0].delta.content or "" for c in plain) == render_text(
        turns[0]["token_ids"]
    )
    assert plain[-1].choices[0].finish_reason == "length"
    # The tool call: held back from the content, whole in the last delta.
    told = streams[1]
    assert all("<tool" not in (c.choices[0].delta.content or "") for c in told)
    assert "".join(c.choices[0].delta.content or "" for c in told) == "Looking."
    end = told[-1].choices[0]
    assert end.finish_reason == "tool_calls"
    (call,) = end.delta.tool_calls
    assert call.index == 0 and call.id.startswith("chatcmpl-tool-") and call.type == "function"
    assert call.function.name == "grep"
    assert json.loads(call.function.arguments) == {"pattern": "def main"}
    assert turns[1]["token_ids"] == tokenize(SCRIPT)
    assert third.model_extra["session"] == {"id": "streamed", "turn": 2, "branch": False}
    assert prompts[2][: len(prompts[1]) + len(sampled[1][0])] == prompts[1] + sampled[1][0]
    assert engine.stats.by_path["/v1/chat/completions"] == 0


async def test_a_stream_the_client_leaves_records_nothing(gateway: Gateway, engine: Any) -> None:
    head = {"X-Session-Id": "left"}
    body = {"model": "sim-base", "max_tokens": 4, "return_token_ids": True}
    messages = [{"role": "user", "content": "go"}]
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        one = (
            await client.post(
                "/v1/chat/completions", json={**body, "messages": messages}, headers=head
            )
        ).json()
        messages = [*messages, one["choices"][0]["message"], {"role": "user", "content": "more"}]
        engine.faults.stall_body = 1  # the engine sends its head, then nothing
        streamed = {**body, "messages": messages, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=streamed, headers=head) as r:
            assert r.status_code == 200
        # The client left: the engine saw the hang-up, the gateway unwound the turn.
        with trio.fail_after(30):
            await engine.stats.wait_for(lambda s: s.aborted >= 1)
        await trio.testing.wait_all_tasks_blocked()
        kept = (await client.get("/v1/sessions/left")).json()
        # A streamed turn whose history cannot be rendered: a JSON 400 before any stream.
        bad = {**streamed, "messages": [*messages, {"role": "user", "content": {"no": 1}}]}
        refused = await client.post("/v1/chat/completions", json=bad, headers=head)
        again = await client.post(
            "/v1/chat/completions", json={**body, "messages": messages}, headers=head
        )
    assert [t["token_ids"] for t in kept["turns"]] == [one["choices"][0]["token_ids"]]
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "render_failed"
    assert refused.headers["content-type"].startswith("application/json")
    assert again.status_code == 200  # not left busy
    two = again.json()
    assert two["session"] == {"id": "left", "turn": 1, "branch": False}
    p1, t1 = one["prompt_token_ids"], one["choices"][0]["token_ids"]
    assert two["prompt_token_ids"][: len(p1) + len(t1)] == p1 + t1
    assert engine.stats.by_path["/v1/completions"] == 3  # the left stream was generated once
