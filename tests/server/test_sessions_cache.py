"""A session's turns hit the engine's prefix cache and stay on the engine that
holds it (docs/sessions.md, "Quick start"): measured on the sim's cache."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from gateway_harness import open_gateway, open_sim

SYSTEM = "You are a coding agent. " * 40  # ~1,000 tokens on the sim (a byte a token)


async def _episode(
    client: httpx.AsyncClient, engines: list[Any], session: str | None
) -> list[float]:
    """Ten turns; each turn's prefix-cache hit rate (cached / prompt tokens) on the engines."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "fix it"},
    ]
    head = {} if session is None else {"X-Session-Id": session}
    rates = []
    for turn in range(10):
        before = [(e.stats.prompt_tokens_cached, e.stats.prompt_tokens_computed) for e in engines]
        body = {
            "model": "sim-base",
            "messages": messages,
            "max_tokens": 16,
            "return_token_ids": True,
        }
        answer = (await client.post("/v1/chat/completions", json=body, headers=head)).json()
        cached = sum(
            e.stats.prompt_tokens_cached - b[0] for e, b in zip(engines, before, strict=True)
        )
        computed = sum(
            e.stats.prompt_tokens_computed - b[1] for e, b in zip(engines, before, strict=True)
        )
        rates.append(cached / (cached + computed))
        messages += [
            answer["choices"][0]["message"],
            {"role": "tool", "content": f"test {turn} failed"},
        ]
    return rates


@pytest.mark.parametrize("routing", ["session", "prefix"])
async def test_session_turns_hit_the_prefix_cache_on_one_engine(
    routing: str, fd_baseline: int
) -> None:
    async with (
        open_sim(prefix_cache_tokens=1 << 20) as one,
        open_sim(prefix_cache_tokens=1 << 20) as two,
        open_gateway(one.url, two.url, routing=routing) as gw,
        httpx.AsyncClient(base_url=gw.url) as client,
    ):
        rates = await _episode(client, [one, two], "agent-1")
        served = sorted(
            [one.stats.by_path["/v1/completions"], two.stats.by_path["/v1/completions"]]
        )
        assert served == [0, 10]  # every turn where the session's KV is
        for engine in (one, two):
            engine.prefix_cache.clear()
        plain = await _episode(client, [one, two], None)
        assert await gw.pool_active() == 0
    print(
        f"{routing}: hit rate per turn with sessions {[round(r, 3) for r in rates]}, without {[round(r, 3) for r in plain]}"
    )
    assert min(rates[1:]) >= 0.95
    assert sum(plain[1:]) < sum(rates[1:])  # re-rendered turns miss where the text was re-tokenized
