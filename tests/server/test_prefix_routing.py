"""routing = "prefix" through the gateway: a second turn, without any header, is a cache hit."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import openai
from gateway_harness import open_gateway, open_sim


async def test_second_turn_hits_the_prefix_cache_without_a_session_header(
    fd_baseline: int,
) -> None:
    async with AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(open_sim(prefix_cache_tokens=1 << 16))
            for _ in range(4)
        ]
        gateway = await stack.enter_async_context(
            open_gateway(*(e.url for e in engines), routing="prefix", health_interval=3600.0)
        )
        client = await stack.enter_async_context(
            openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
        )
        messages: list[Any] = [
            {"role": "system", "content": "You are a careful agent. " * 8},
            {"role": "user", "content": "Task 17: list the files, then open the largest one."},
        ]
        first = await client.chat.completions.create(
            model="sim-base", messages=messages, max_tokens=12
        )
        assert first.usage is not None and first.usage.prompt_tokens_details is None
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Tool output: 3 files. Open the largest."},
        ]
        second = await client.chat.completions.create(
            model="sim-base", messages=messages, max_tokens=12
        )
        usage = second.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        # The whole first turn's prompt, in full blocks of 16, was reused.
        assert cached >= first.usage.prompt_tokens - 15
        served = [e for e in engines if e.stats.by_path["/v1/chat/completions"]]
        assert len(served) == 1
        assert served[0].stats.prompt_tokens_cached == cached
        assert sum(e.stats.prompt_tokens_computed for e in engines) == (
            first.usage.prompt_tokens + usage.prompt_tokens - cached
        )
        assert await gateway.pool_active() == 0
