"""A /v1/chat/completions stream through the gateway, read by the real ``openai`` SDK,
across an abort weight update with replay "continue": one unbroken stream whose
finish reasons are OpenAI's, never the engine's "abort" (docs/operations.md,
"Which routes continue")."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import trio
from gateway_harness import open_gateway, open_sim

from trioforward.sim import expected_completion, render_text, tokenize

BUDGET = 300  # 3 s of decoding: the pause lands mid-generation on a loaded machine too


async def test_the_openai_sdk_reads_a_chat_stream_continued_across_an_abort_pause(
    fd_baseline: int,
) -> None:
    async with (
        open_sim(decode_ms_per_token=10) as engine,
        open_gateway(engine.url) as gw,
    ):
        sdk = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        chunks: list[Any] = []
        with trio.fail_after(10):  # the engine's kind is probed (it decodes a few tokens)
            for e in gw.state.client.engines.list():
                await gw.state.client.engines.wait_kind(e.url)
        before = engine.stats.tokens_decoded
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            assert (await c.post("/admin/resume", json={"weight_version": "v1"})).status_code == 200

            async def one() -> None:
                stream = await sdk.chat.completions.create(
                    model="sim-base",
                    messages=[{"role": "user", "content": "hello"}],
                    max_tokens=BUDGET,
                    seed=3,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks.extend([chunk async for chunk in stream])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                await engine.stats.wait_for(lambda s: s.tokens_decoded >= before + 3)
                paused = await c.post(
                    "/admin/pause", json={"engine_mode": "abort", "replay": "continue"}
                )
                assert paused.status_code == 200, paused.text
                assert (
                    await c.post("/admin/resume", json={"weight_version": "v2"})
                ).status_code == 200
        await sdk.close()
        choices = [ch for chunk in chunks for ch in chunk.choices]
        reasons = [ch.finish_reason for ch in choices]
        assert all(r is None for r in reasons[:-1]) and reasons[-1] == "length"
        assert len({chunk.id for chunk in chunks}) == 1
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == BUDGET
        # The text is the first segment's tokens then the continuation's, none twice.
        text = "".join(ch.delta.content or "" for ch in choices)
        cut = engine.stats.by_path["/v1/completions"]
        assert engine.stats.pause_aborted == 1  # the pause ended the chat stream on the engine
        assert cut == 1 and engine.stats.by_path["/v1/chat/completions"] == 1
        assert engine.stats.tokens_decoded - before == BUDGET  # nothing decoded twice
        assert text.count(" t") == BUDGET
        # The head's k tokens, then the continuation's from prompt + those k, none twice.
        prompt = tokenize("user: hello\n")  # the sim's chat template
        head = expected_completion("sim-base", prompt, 3, 0, BUDGET)[0]

        def joined(k: int) -> str:
            tail = expected_completion("sim-base", prompt + head[:k], 3, 0, BUDGET - k)[0]
            return render_text(head[:k]) + render_text(tail)

        assert any(text == joined(k) for k in range(3, BUDGET))
        assert await gw.pool_active() == 0

