"""Agent sessions on the chat route (docs/sessions.md): a turn that extends the
previous one is prompted with the previous prompt + the sampled ids + the new
messages' tokens, asserted on the engine's own record of what it got and sampled."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from gateway_harness import Gateway

from trioforward.sim import tokenize


def _turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "sim-base", "messages": messages, "max_tokens": 6, "return_token_ids": True}


async def test_second_turn_is_prompted_with_first_prompt_and_sampled_tokens(
    gateway: Gateway, engine: Any
) -> None:
    head = {"X-Session-Id": "episode-1"}
    messages = [{"role": "system", "content": "act"}, {"role": "user", "content": "go"}]
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        one = (await client.post("/v1/chat/completions", json=_turn(messages), headers=head)).json()
        messages += [one["choices"][0]["message"], {"role": "user", "content": "again"}]
        two = (await client.post("/v1/chat/completions", json=_turn(messages), headers=head)).json()
        got = await client.get("/v1/sessions/episode-1")
        # The same history without a session: the chat route re-renders the text.
        plain = (await client.post("/v1/chat/completions", json=_turn(messages))).json()
    p1, t1, p2 = one["prompt_token_ids"], one["choices"][0]["token_ids"], two["prompt_token_ids"]
    assert p2[: len(p1) + len(t1)] == p1 + t1
    assert p2[len(p1) + len(t1) :] == tokenize("\nuser: again\n")
    # The engine's side: what it was prompted with and what it sampled.
    assert list(engine.stats.prompts)[:2] == [p1, p2]
    assert list(engine.stats.sampled)[:2] == [[t1], [two["choices"][0]["token_ids"]]]
    assert plain["prompt_token_ids"][len(p1) : len(p1) + len(t1)] != t1  # the drift, without
    assert got.status_code == 200
    trajectory = got.json()
    assert [t["prompt_token_ids"] for t in trajectory["turns"]] == [p1, p2]
    assert [t["token_ids"] for t in trajectory["turns"]] == [t1, two["choices"][0]["token_ids"]]
    assert all(t["engine_time"] > 0 and t["queue_time"] >= 0 for t in trajectory["turns"])
    assert (
        trajectory["turns"][0]["started"]
        <= trajectory["turns"][0]["finished"]
        <= trajectory["turns"][1]["started"]
    )
    assert trajectory["branch_points"] == [] and two["session"] == {
        "id": "episode-1",
        "turn": 1,
        "branch": False,
    }
    (sequence,) = trajectory["sequences"]
    assert sequence["token_ids"] == p2 + two["choices"][0]["token_ids"]
    mask = sequence["loss_mask"]
    assert mask == [0] * len(p1) + [1] * len(t1) + [0] * (len(p2) - len(p1) - len(t1)) + [1] * 6
    assert (
        engine.stats.by_path["/v1/completions"] == 2
        and engine.stats.by_path["/v1/chat/completions"] == 1
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the test suite",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def _script(turn: int) -> str:
    """What the model 'says' on an even turn: words, then a call (the hermes format)."""
    args = json.dumps({"path": f"tests/test_{turn}.py"})
    return f'Running them.<tool_call>\n{{"name": "run_tests", "arguments": {args}}}\n</tool_call>'


async def test_ten_turn_openai_sdk_agent_loop_with_tools_and_a_weight_update(
    gateway: Gateway, engine: Any
) -> None:
    from openai import AsyncOpenAI

    async with httpx.AsyncClient(base_url=gateway.url) as admin:
        assert (await admin.post("/admin/resume", json={"weight_version": "v1"})).status_code == 200
        sdk = AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
            default_headers={"X-Session-Id": "agent-7"},
        )  # fmt: skip
        messages: list[Any] = [
            {"role": "system", "content": "You fix failing tests."},
            {"role": "user", "content": "tests/test_x.py fails"},
        ]
        answers = []
        async with sdk:
            for turn in range(10):
                if turn == 5:  # the trainer pushed new weights mid-episode
                    assert (
                        await admin.post("/admin/resume", json={"weight_version": "v2"})
                    ).status_code == 200
                if turn % 2 == 0:  # the model calls the tool (the sim says what it is told)
                    engine.replies.append(_script(turn))
                answer = await sdk.chat.completions.create(
                    model="sim-base", messages=messages, tools=TOOLS,
                    max_tokens=4 + turn if turn % 2 else 200,
                    logprobs=True, extra_body={"return_token_ids": True},
                )  # fmt: skip
                answers.append(answer)
                message = answer.choices[0].message
                messages.append(message.model_dump())  # as harnesses do
                for call in message.tool_calls or []:  # the harness runs the tool it was asked
                    path = json.loads(call.function.arguments)["path"]
                    messages.append(
                        {"role": "tool", "tool_call_id": call.id, "content": f"{path} failed"}
                    )
                if not message.tool_calls:
                    messages.append({"role": "user", "content": "try again"})
        trajectory = (await admin.get("/v1/sessions/agent-7")).json()
    prompts, sampled = list(engine.stats.prompts), list(engine.stats.sampled)
    assert len(prompts) == len(sampled) == 10  # one engine generation a turn, nothing retried
    lengths = [len(_script(k)) if k % 2 == 0 else 4 + k for k in range(10)]
    turns = trajectory["turns"]
    for k, turn in enumerate(turns):
        choice = answers[k].choices[0]
        if k % 2 == 0:  # the call, parsed as the engine's chat route would
            (call,) = choice.message.tool_calls
            assert call.type == "function" and call.function.name == "run_tests"
            assert json.loads(call.function.arguments) == {"path": f"tests/test_{k}.py"}
            assert (
                choice.message.content == "Running them." and choice.finish_reason == "tool_calls"
            )
            assert turn["token_ids"] == tokenize(
                _script(k)
            )  # the text the model sampled, all of it
        else:
            assert choice.message.tool_calls is None and choice.finish_reason == "length"
        # The engine's own record: what it was prompted with and what it sampled.
        assert turn["prompt_token_ids"] == prompts[k]
        assert [turn["token_ids"]] == sampled[k]
        assert turn["token_ids"] == choice.model_extra["token_ids"]
        assert len(turn["token_ids"]) == lengths[k] and not turn["branch"]
        lps = [e.logprob for e in choice.logprobs.content]
        assert turn["logprobs"] == pytest.approx(lps)
        if k:
            assert (
                prompts[k][: len(prompts[k - 1]) + len(sampled[k - 1][0])]
                == prompts[k - 1] + sampled[k - 1][0]
            )
        version = "v1" if k < 5 else "v2"
        assert turn["weight_versions"] == [{"version": version, "start": 0, "end": lengths[k]}]
    (sequence,) = trajectory["sequences"]
    assert sequence["token_ids"] == prompts[9] + sampled[9][0]
    mask = sequence["loss_mask"]
    assert sum(mask) == sum(lengths)
    for k in range(10):  # the model's tokens, exactly where each turn put them
        start = len(prompts[k])
        assert mask[start : start + lengths[k]] == [1] * lengths[k]
        assert sequence["token_ids"][start : start + lengths[k]] == sampled[k][0]
    assert (
        engine.stats.by_path["/tokenize"] >= 10
        and engine.stats.by_path["/v1/chat/completions"] == 0
    )
