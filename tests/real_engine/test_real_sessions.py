"""Agent sessions over a real vLLM (docs/sessions.md): the openai SDK drives a
multi-turn loop with tools through the gateway; vLLM renders the turns
(``/tokenize`` with chat messages) and is prompted with the exact ids sampled
before. Checked against vLLM itself: its own chat rendering of the first turn,
and its own greedy answer for each turn's prompt."""

from __future__ import annotations

from typing import Any

import httpx
import openai
from conftest import Server
from vllm_probes import MODEL

# Ten turns of 4 sampled tokens with short environment replies fit the tiny
# model's 256-token length (docs/compatibility.md, "The real-engine suite").
TURNS = 10
TOOLS = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]


def test_openai_sdk_session_on_vllm_is_prompted_with_what_it_sampled(
    gateway_base: Server, vllm_base: Server
) -> None:
    sdk = openai.OpenAI(
        base_url=gateway_base.url + "/v1", api_key="anything", max_retries=0,
        default_headers={"X-Session-Id": "real-agent"},
    )  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": "Hello, how are you?"}]
    answers = []
    for turn in range(TURNS):
        answer = sdk.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, temperature=0,
            logprobs=True, extra_body={"return_token_ids": True},
        )  # fmt: skip
        answers.append(answer)
        messages.append(answer.choices[0].message.model_dump())
        messages.append(
            {"role": "tool", "content": f"r{turn}"} if turn % 2 == 0 else {"role": "user", "content": "ok"}
        )
    trajectory = httpx.get(f"{gateway_base.url}/v1/sessions/real-agent").json()
    turns = trajectory["turns"]
    assert len(turns) == TURNS and trajectory["branch_points"] == []
    # vLLM's own chat rendering of the first turn is the session's first prompt.
    direct = httpx.post(
        f"{vllm_base.url}/v1/chat/completions",
        json={"model": MODEL, "messages": messages[:1], "max_tokens": 8, "temperature": 0, "return_token_ids": True},
    ).json()  # fmt: skip
    assert turns[0]["prompt_token_ids"] == direct["prompt_token_ids"]
    for k, turn in enumerate(turns):
        extras = answers[k].model_extra or {}
        assert turn["prompt_token_ids"] == extras["prompt_token_ids"]
        assert turn["token_ids"] == answers[k].choices[0].model_extra["token_ids"]
        if k:
            prev = turns[k - 1]
            assert (
                turn["prompt_token_ids"][: len(prev["prompt_token_ids"]) + len(prev["token_ids"])]
                == prev["prompt_token_ids"] + prev["token_ids"]
            )
        # vLLM, asked directly with the same prompt ids, samples the same greedy ids.
        again = httpx.post(
            f"{vllm_base.url}/v1/completions",
            json={"model": MODEL, "prompt": turn["prompt_token_ids"], "max_tokens": 4, "temperature": 0, "return_token_ids": True},
        ).json()  # fmt: skip
        assert again["choices"][0]["token_ids"] == turn["token_ids"]
    (sequence,) = trajectory["sequences"]
    assert sum(sequence["loss_mask"]) == sum(len(t["token_ids"]) for t in turns)
