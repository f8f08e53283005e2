"""What verifiers' harness needs from a chat stream across an abort pause with
``replay: "continue"`` (docs/operations.md, "Which routes continue"): the stream
is continued on the new weights as a completion stream is — no
``finish_reason: "abort"`` (not an OpenAI finish reason: a strict client
rejects the answer and redoes the call), all the tokens asked for, one
``[DONE]`` — and the engine ran the call once plus its continuation.

Marked xfail (strict) until chat streams continue after an abort: that change
belongs with the one token-level core (issue 36 item 4); when it lands this
test passes and the strict mark turns that into a failure to remove it. Today
the stream ends well but not by continuation: the pause waits for it to finish
on the old weights (the engine aborts nothing, ``pause_aborted`` stays 0, the
pause takes the stream's whole length)."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from gateway_harness import open_gateway, open_sim

BUDGET = 200
CHAT = {
    "model": "sim-base",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": BUDGET,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@pytest.mark.xfail(reason="chat streams are not continued after an abort pause yet", strict=True)
async def test_a_chat_stream_across_an_abort_continue_pause_ends_as_openai_clients_accept(
    fd_baseline: int,
) -> None:
    async with open_sim(decode_ms_per_token=10) as engine, open_gateway(engine.url) as gw:
        events: list[str] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

            async def stream() -> None:
                async with c.stream("POST", "/v1/chat/completions", json=CHAT) as reply:
                    assert reply.status_code == 200
                    async for line in reply.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream)
                with trio.fail_after(10):
                    await engine.stats.wait_for(lambda s: s.tokens_decoded >= 5)
                paused = await c.post("/admin/pause", json={"engine_mode": "abort", "replay": "continue"})
                assert paused.status_code == 200
                await c.post("/admin/resume", json={"weight_version": "v2"})
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in ch for ch in chunks)
        reasons = [ch["choices"][0].get("finish_reason") for ch in chunks if ch.get("choices")]
        assert "abort" not in reasons and reasons[-1] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == BUDGET
        assert engine.stats.pause_aborted == 1
        assert engine.stats.by_path["/v1/chat/completions"] == 2  # the call and its continuation
