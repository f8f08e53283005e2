"""Tinker samples under routing = "prefix": routed by their prompt, not by their implied session key."""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx
import pytest
from _tinker_harness import real_gateway

from trioforward.sim import open_engine

PROMPT = list(range(1000, 1064))  # 320 bytes rendered: one routing block


@pytest.mark.parametrize("routing", ["prefix", "session"])
async def test_samples_of_one_prompt_share_an_engine_under_prefix_routing(
    routing: str, fd_baseline: int
) -> None:
    # Each sample carries X-Session-ID "<sampler>:<seq_id>" to the engine; under
    # "session" that key routes it, under "prefix" the prompt does.
    async with AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(open_engine(port=0, prefix_cache_tokens=1 << 16))
            for _ in range(4)
        ]
        url, app = await stack.enter_async_context(
            real_gateway(*(e.url for e in engines), routing=routing, health_interval=3600.0)
        )
        http = await stack.enter_async_context(
            httpx.AsyncClient(base_url=url, headers={"X-API-Key": "tml-dummy"})
        )
        r = await http.post(
            "/api/v1/create_sampling_session",
            json={"session_id": "s", "sampling_session_seq_id": 0, "base_model": "sim-base"},
        )
        sampling_session = r.json()["sampling_session_id"]
        # Rendezvous hashing puts 6 random keys on one of 4 engines 1 run in 1,024
        # (a fresh-clone CI run saw it); 16 keys do 1 run in 4**15.
        samples = 6 if routing == "prefix" else 16
        for seq_id in range(samples):  # a group of samples of one prompt, one request each
            body = {
                "num_samples": 1,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
                "sampling_params": {"max_tokens": 4, "seed": seq_id},
                "sampling_session_id": sampling_session,
                "seq_id": seq_id,
            }
            rid = (await http.post("/api/v1/asample", json=body)).json()["request_id"]
            result = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            assert result.status_code == 200, result.text
        served = [e for e in engines if e.stats.by_path["/v1/completions"]]
        if routing == "prefix":
            assert len(served) == 1
            # Every sample after the first reused the prompt's 3 full blocks of 16.
            assert served[0].stats.prompt_tokens_cached == 5 * 48
        else:
            assert len(served) > 1  # one engine per sequence key
        assert sum(e.stats.by_path["/v1/completions"] for e in engines) == samples
        assert app.extensions["trioforward"].client.statistics().pool.active == 0
