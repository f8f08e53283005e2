"""A stream whose vLLM is killed mid-generation completes on a second vLLM
(docs/operations.md, "Migration")."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import orjson
import trio
from conftest import Server, _vllm, wait_healthy
from test_real_disconnect import metric
from vllm_probes import MODEL, PROMPT_IDS

import trioforward

MAX_TOKENS = 200


async def test_a_stream_completes_on_a_second_vllm_when_its_own_is_killed(
    workdir: Path, vllm_base: Server
) -> None:
    victim = _vllm(workdir, "vllm_victim", False)
    try:
        await trio.to_thread.run_sync(wait_healthy, victim)
        prompted = metric(vllm_base, "vllm:prompt_tokens_total")
        body = {
            "model": MODEL,
            "prompt": PROMPT_IDS,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "return_token_ids": True,
        }
        ids: list[int] = []
        finish = []
        killed_at = 0
        async with trioforward.open_client(engines=[victim.url]) as client:
            async with client.stream("/v1/completions", json=body) as fs:
                assert fs.status == 200
                data = b""
                async for chunk in fs.aiter_bytes():
                    data += chunk
                    *events, data = data.split(b"\n\n")
                    for event in events:
                        if event == b"data: [DONE]":
                            continue
                        for choice in orjson.loads(event[6:])["choices"]:
                            ids.extend(choice["token_ids"])
                            finish.append(choice["finish_reason"])
                    if len(ids) >= 8 and not killed_at:
                        killed_at = len(ids)
                        client.engines.add(vllm_base.url)
                        os.killpg(victim.process.pid, signal.SIGKILL)  # the engine dies
            migrations = client.statistics().migrations
        assert killed_at and victim.process.wait(30) is not None
        assert len(ids) == MAX_TOKENS and finish[-1] == "length"
        assert migrations == {("/v1/completions", "broken"): 1}
        # The second vLLM was prompted once, with the prompt + the tokens relayed
        # before the kill (at least those seen then, fewer than all).
        grew = metric(vllm_base, "vllm:prompt_tokens_total") - prompted
        assert len(PROMPT_IDS) + killed_at <= grew < len(PROMPT_IDS) + MAX_TOKENS
    finally:
        victim.stop()
