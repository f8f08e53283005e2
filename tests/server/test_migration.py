"""A stream whose engine dies mid-answer goes on on another engine, through the
gateway: counted on ``/metrics``, both engines on the access-log line
(docs/operations.md, "Migration")."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from gateway_harness import generation_requests, open_gateway, open_sim
from test_metrics import scrape

from trioforward.sim import expected_completion, render_text

PROMPT = [5, 6, 7]


async def test_a_stream_migrates_off_a_dying_engine(fd_baseline: int, caplog: Any) -> None:
    caplog.set_level("INFO", logger="trioforward.access")
    body = {"model": "sim-base", "prompt": PROMPT, "max_tokens": 12, "seed": 2, "stream": True}
    async with (
        open_sim(decode_ms_per_token=20) as dying,
        open_sim(decode_ms_per_token=20) as survivor,
        open_gateway(dying.url, health_interval=3600.0) as gw,
        httpx.AsyncClient(base_url=gw.url) as client,
    ):
        chunks: list[bytes] = []
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                if b"".join(chunks).count(b"\n\n") == 3:  # 3 tokens relayed
                    added = await client.post("/admin/engines", json={"url": survivor.url})
                    assert added.status_code == 201
                    await dying.stop_listening()
        data = b"".join(chunks)
        assert data.endswith(b"data: [DONE]\n\n")
        events = [orjson.loads(e[6:]) for e in data.split(b"\n\n") if e and e != b"data: [DONE]"]
        text = "".join(c["text"] for e in events for c in e["choices"])
        [seen] = [p for p in survivor.stats.prompts if p[:3] == PROMPT]
        k = len(seen) - len(PROMPT)
        head = expected_completion("sim-base", PROMPT, 2, 0, 12)[0]
        assert k >= 3 and seen == PROMPT + head[:k]
        tail = expected_completion("sim-base", seen, 2, 0, 12 - k)[0]
        assert text == render_text(head[:k] + tail)  # every token once, in order
        assert generation_requests(dying) == 1 and generation_requests(survivor) == 1
        samples = await scrape(client, gw.url)
        key = ("trioforward_migrations_total", (("reason", "broken"), ("route", "/v1/completions")))
        assert samples[key] == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
    [line] = [x for x in lines if x.startswith("POST /v1/completions")]
    assert f"engines={dying.url},{survivor.url}" in line and f"engine={survivor.url}" in line
