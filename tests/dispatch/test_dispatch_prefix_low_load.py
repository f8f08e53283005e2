"""Prefix routing at low load: a prefix stays on its engine while it has free
slots (docs/dispatch.md, "Prefix routing"), with simulated engines."""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio
from dispatch_testing import client_for

from trioforward.sim import open_engine


async def test_a_prefix_stays_on_its_engine_while_that_engine_has_free_slots(fd_baseline: int) -> None:
    # Low load: 4 engines of 16 slots, 8 requests in flight, 40 conversations of
    # 5 turns, each with its own 32-token prefix. The load bound alone
    # (ceil(1.25 * (m + 1) / 4) = 3) split 15 of the 40 over several engines,
    # though every engine had idle slots: each split recomputes the prefix.
    async with AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(open_engine(decode_ms_per_token=2, prefix_cache_tokens=1 << 16))
            for _ in range(4)
        ]
        client = await stack.enter_async_context(
            client_for(*engines, routing="prefix", prefix_tokens=32, engine_capacity=16)
        )
        served: dict[int, set[str]] = {c: set() for c in range(40)}

        async def conversation(c: int) -> None:
            prompt = [1000 + 40 * c + i for i in range(32)]
            for turn in range(5):
                prompt = prompt + [7] * 8 + [turn + 1] * 8
                response = await client.post(
                    "/v1/completions", json={"model": "sim-base", "prompt": prompt, "max_tokens": 4}
                )
                assert response.status == 200
                served[c].add(response.engine)

        async def worker(w: int) -> None:
            for c in range(w, 40, 8):
                await conversation(c)

        async with trio.open_nursery() as nursery:
            for w in range(8):
                nursery.start_soon(worker, w)
        split = [c for c, urls in served.items() if len(urls) > 1]
        print(f"split prefixes: {len(split)} of 40")
        assert split == []
        assert sum(e.stats.by_path["/v1/completions"] for e in engines) == 200
