"""Agent sessions on the chat route (docs/sessions.md): a turn that extends the
previous one is prompted with the previous prompt + the sampled ids + the new
messages' tokens, asserted on the engine's own record of what it got and sampled."""

from __future__ import annotations

from typing import Any

import httpx
from gateway_harness import Gateway, open_gateway

from trioforward.sim import tokenize


def _turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "sim-base", "messages": messages, "max_tokens": 6, "return_token_ids": True}


async def test_second_turn_is_prompted_with_first_prompt_and_sampled_tokens(gateway: Gateway, engine: Any) -> None:
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
    assert p2[len(p1) + len(t1) :] == tokenize("assistant: \nuser: again\n")
    # The engine's side: what it was prompted with and what it sampled.
    assert list(engine.stats.prompts)[:2] == [p1, p2]
    assert list(engine.stats.sampled)[:2] == [[t1], [two["choices"][0]["token_ids"]]]
    assert plain["prompt_token_ids"][len(p1) : len(p1) + len(t1)] != t1  # the drift, without
    assert got.status_code == 200
    trajectory = got.json()
    assert [t["prompt_token_ids"] for t in trajectory["turns"]] == [p1, p2]
    assert [t["token_ids"] for t in trajectory["turns"]] == [t1, two["choices"][0]["token_ids"]]
    assert trajectory["branch_points"] == [] and two["session"] == {"id": "episode-1", "turn": 1, "branch": False}
    (sequence,) = trajectory["sequences"]
    assert sequence["token_ids"] == p2 + two["choices"][0]["token_ids"]
    mask = sequence["loss_mask"]
    assert mask == [0] * len(p1) + [1] * len(t1) + [0] * (len(p2) - len(p1) - len(t1)) + [1] * 6
    assert engine.stats.by_path["/v1/completions"] == 2 and engine.stats.by_path["/v1/chat/completions"] == 1
