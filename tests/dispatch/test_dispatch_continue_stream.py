"""A /v1/completions stream continued across abort updates goes on token by token
(docs/operations.md, "Which routes continue")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for

from trioforward.sim import expected_completion, open_engine, render_text

PROMPT = [1, 2, 3]
MODEL = "sim-base"


async def update(client: Any, version: str) -> None:
    await client.pause(engine_mode="abort", replay="continue")
    await trio.sleep(30)  # the weights are pushed
    await client.resume(weight_version=version)


def events_of(chunks: list[bytes]) -> list[dict[str, Any]]:
    data = b"".join(chunks)
    assert data.endswith(b"data: [DONE]\n\n") and data.count(b"[DONE]") == 1
    parts = [e for e in data.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in parts)
    return [orjson.loads(e[6:]) for e in parts[:-1]]


@pytest.mark.parametrize("n", [1, 2])
async def test_the_continuation_is_relayed_token_by_token_as_it_decodes(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, n: int
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        chunks: list[bytes] = []
        decoded_at: list[int] = []  # the engine's tokens_decoded as each chunk arrived
        payload = body(prompt=PROMPT, max_tokens=10, seed=3, logprobs=1, n=n, stream=True)
        payload["stream_options"] = {"include_usage": True}

        async def read() -> None:
            async with client.stream(COMPLETION, json=payload) as fs:
                async for chunk in fs.aiter_bytes():
                    chunks.append(chunk)
                    decoded_at.append(engine.stats.tokens_decoded)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)  # 4 tokens each under v1
            await update(client, "v2")
        events = events_of(chunks)
        *deltas, usage = events
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10 * n
        assert len({e["id"] for e in events}) == 1
        for index in range(n):
            mine = [c for e in deltas for c in e["choices"] if c["index"] == index]
            head, _, _ = expected_completion(MODEL, PROMPT, 3, index, 10)
            tail, tail_lp, _ = expected_completion(MODEL, PROMPT + head[:4], 3, 0, 6)
            text = "".join(c["text"] for c in mine)
            assert text == render_text(head[:4] + tail)  # no token lost or repeated at the seam
            lps = [lp for c in mine for lp in c["logprobs"]["token_logprobs"]]
            assert lps[4:] == tail_lp and len(lps) == 10
            offsets = [o for c in mine for o in c["logprobs"]["text_offset"]]
            assert offsets == sorted(offsets) and len(offsets) == 10
            assert all(c["finish_reason"] is None for c in mine[:-1])
            assert mine[-1]["finish_reason"] == "length"
            assert mine[-1]["weight_versions"] == [
                {"version": "v1", "start": 0, "end": 4},
                {"version": "v2", "start": 4, "end": 10},
            ]
            assert all("weight_versions" not in c for c in mine[:-1])
            # After the seam: one event per token, not one for the whole continuation.
            assert sum(1 for c in mine if c["logprobs"]["tokens"]) >= 10
        # The continuation's first tokens reached the reader while it still decoded.
        seam = next(
            i for i, c in enumerate(chunks) if b"text_offset" in c and decoded_at[i] > 4 * n
        )
        assert decoded_at[seam] < 10 * n
        assert engine.stats.tokens_decoded == 10 * n


async def test_two_updates_during_one_stream(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        chunks: list[bytes] = []
        payload = body(
            prompt=PROMPT, max_tokens=20, seed=3, logprobs=1, stream=True, return_token_ids=True
        )

        async def read() -> None:
            async with client.stream(COMPLETION, json=payload) as fs:
                chunks.extend([chunk async for chunk in fs.aiter_bytes()])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.35)  # 3 tokens under v1
            await update(client, "v2")
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.55)  # 5 more under v2
            await update(client, "v3")
        choices = [c for e in events_of(chunks) for c in e["choices"]]
        assert all(c["finish_reason"] in (None, "length") for c in choices)
        tokens = [t for c in choices for t in c["token_ids"]]
        head, _, _ = expected_completion(MODEL, PROMPT, 3, 0, 20)
        mid, _, _ = expected_completion(MODEL, PROMPT + head[:3], 3, 0, 17)
        last, _, _ = expected_completion(MODEL, PROMPT + head[:3] + mid[:5], 3, 0, 12)
        assert tokens == head[:3] + mid[:5] + last  # every token once, in order
        assert choices[-1]["weight_versions"] == [
            {"version": "v1", "start": 0, "end": 3},
            {"version": "v2", "start": 3, "end": 8},
            {"version": "v3", "start": 8, "end": 20},
        ]
        assert engine.stats.tokens_decoded == 20
