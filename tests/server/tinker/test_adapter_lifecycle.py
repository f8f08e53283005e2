"""The adapter set stays bounded (docs/server.md, "Admin API"): 150 "training steps",
each a Tinker sampling session on a new ``tinker://run1/sampler_weights/step_<i>``
sampled once. Every sample succeeds, the engine never holds more than
``max_loaded_adapters`` (least recently used ones unloaded), the registry and the
``/metrics`` series stay bounded."""

from __future__ import annotations

import httpx
import trio
from _tinker_harness import real_gateway
from test_futures_http import asample_body

from trioforward.sim import open_engine

STEPS = 150
MAX_LOADED = 4
MAX_REGISTERED = 8


async def _sample_step(
    http: httpx.AsyncClient, session_id: str, step: int, seq: int = 0
) -> None:
    r = await http.post(
        "/api/v1/create_sampling_session",
        json={
            "session_id": session_id,
            "sampling_session_seq_id": step + 1000 * seq,
            "model_path": f"tinker://run1/sampler_weights/step_{step}",
        },
    )
    assert r.status_code == 200, r.text
    sampler = r.json()["sampling_session_id"]
    future = (await http.post("/api/v1/asample", json=asample_body(sampler, 0))).json()
    while True:
        r = await http.post("/api/v1/retrieve_future", json={"request_id": future["request_id"]})
        if r.status_code == 200:
            assert r.headers["content-type"] == "application/x-protobuf", r.text
            return
        assert r.status_code == 408, r.text  # still running: poll again


async def test_150_steps_keep_the_adapter_set_bounded(fd_baseline: int) -> None:
    async with (
        open_engine(port=0) as engine,
        real_gateway(
            engine.url,
            adapter_root="/adapters",
            max_loaded_adapters=MAX_LOADED,
            max_registered_adapters=MAX_REGISTERED,
        ) as (url, app),
    ):
        peak = 0
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            r = await http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "x"})
            session_id = r.json()["session_id"]
            with trio.fail_after(120):
                for step in range(STEPS):
                    await _sample_step(http, session_id, step)
                    peak = max(peak, len(engine.adapters.loaded))
            admin = (await http.get("/admin/adapters")).json()
            metrics = (await http.get("/metrics")).text
            models = (await http.get("/v1/models")).json()["data"]
        # Engine side: every step loaded its adapter once; the set never grew past the bound.
        assert sum(engine.stats.adapter_loads.values()) == STEPS
        assert peak <= MAX_LOADED
        assert sum(engine.stats.adapter_unloads.values()) == STEPS - MAX_LOADED
        assert engine.stats.by_path["/v1/completions"] >= STEPS
        # Gateway side: bounded registry, visible bounds, no per-adapter series.
        assert len(admin["adapters"]) <= MAX_REGISTERED
        assert admin["loaded"] == {
            engine.url: [f"run1_step_{i}" for i in range(STEPS - MAX_LOADED, STEPS)]
        }
        assert admin["max_loaded_adapters"] == MAX_LOADED
        assert admin["sampling_sessions"] == STEPS and admin["max_sampling_sessions"] >= STEPS
        assert len(models) <= 1 + MAX_LOADED + MAX_REGISTERED
        assert "adapter=" not in metrics
        assert f'trioforward_adapter_loads_total{{engine="{engine.url}"}} {float(STEPS)}' in metrics
        assert f'trioforward_adapters_loaded{{engine="{engine.url}"}} {float(MAX_LOADED)}' in metrics
        assert "trioforward_sampling_sessions 150.0" in metrics
        series = [line for line in metrics.splitlines() if line and not line.startswith("#")]
        assert len(series) < 200  # independent of the number of steps


async def test_an_unloaded_adapter_is_loaded_again_on_demand(fd_baseline: int) -> None:
    async with (
        open_engine(port=0) as engine,
        real_gateway(engine.url, adapter_root="/adapters", max_loaded_adapters=1) as (url, app),
    ):
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            session_id = (
                await http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "x"})
            ).json()["session_id"]
            with trio.fail_after(60):
                # Step 0's adapter is unloaded for step 1, then sampled again.
                for seq, step in enumerate((0, 1, 0)):
                    await _sample_step(http, session_id, step, seq)
        assert engine.stats.adapter_loads == {"run1_step_0": 2, "run1_step_1": 1}
        assert sum(engine.stats.adapter_unloads.values()) == 2
        assert list(engine.adapters.loaded) == ["run1_step_0"]
