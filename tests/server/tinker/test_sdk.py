"""End to end: the unmodified tinker SDK samples through the full gateway from simulated engines."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import trio
from _tinker_harness import real_gateway, sdk_sample
from prometheus_client.parser import text_string_to_metric_families

from trioforward.sim import expected_prompt_logprobs, open_engine, sample

pytest.importorskip("trioforward.dispatch", reason="dispatch core not available")

PROMPT = [101, 7, 2048, 3, 977]


def completions(engine: object) -> int:
    by_path = engine.stats.by_path  # type: ignore[attr-defined]
    return int(by_path["/v1/completions"])


async def test_sdk_samples_base_model_with_stops_and_prompt_logprobs(
    sdk_loop: None, fd_baseline: int
) -> None:
    async with open_engine(port=0) as engine, real_gateway(engine.url) as (url, app):
        stop = [" t1", " t2"]
        result = await trio.to_thread.run_sync(
            functools.partial(
                sdk_sample,
                url,
                base_model="sim-base",
                prompt=PROMPT,
                num_samples=3,
                include_prompt_logprobs=True,
                max_tokens=12,
                seed=42,
                temperature=0.7,
                stop=stop,
            )
        )
        assert len(result.sequences) == 3
        for i, seq in enumerate(result.sequences):
            want = sample("sim-base", PROMPT, 42, i, 12, (), stop)
            assert seq.tokens == want.tokens
            assert seq.logprobs == want.logprobs
            assert seq.stop_reason == want.finish_reason
        want_prompt = expected_prompt_logprobs("sim-base", PROMPT)
        got = result.prompt_logprobs
        assert got[0] is None
        for i in range(1, len(PROMPT)):
            assert math.isclose(got[i], want_prompt[i][str(PROMPT[i])]["logprob"], rel_tol=1e-6)
        assert completions(engine) == 1
        assert app.extensions["trioforward"].client.statistics().pool.active == 0
        # The sample is in the gateway's request metrics like any OpenAI request.
        families = {
            s.name: s
            for f in text_string_to_metric_families(
                app.extensions["trioforward"].metrics.render().decode()
            )
            for s in f.samples
            if s.labels.get("route") == "tinker_sample" or s.name.startswith("trioforward_engine_time")
        }
        assert families["trioforward_gateway_requests_total"].value == 1
        assert families["trioforward_gateway_requests_total"].labels["status"] == "200"


async def test_sdk_stop_token_ids(sdk_loop: None, fd_baseline: int) -> None:
    async with open_engine(port=0) as engine, real_gateway(engine.url) as (url, _):
        first = sample("sim-base", PROMPT, 5, 0, 20).tokens
        stop_ids = [first[3]]
        result = await trio.to_thread.run_sync(
            functools.partial(
                sdk_sample,
                url,
                base_model="sim-base",
                prompt=PROMPT,
                num_samples=1,
                max_tokens=20,
                seed=5,
                stop=stop_ids,
            )
        )
        want = sample("sim-base", PROMPT, 5, 0, 20, stop_ids)
        assert result.sequences[0].tokens == want.tokens
        assert result.sequences[0].stop_reason == "stop"


async def test_sdk_samples_lazily_loaded_lora_adapter(
    sdk_loop: None, fd_baseline: int, tmp_path: Path
) -> None:
    adapter_dir = tmp_path / "run7" / "step3"
    adapter_dir.mkdir(parents=True)
    async with (
        open_engine(
            port=0, adapters={"run7_step3": str(adapter_dir)}, lazy_adapters=0.05
        ) as engine,
        real_gateway(engine.url, adapter_root=str(tmp_path)) as (url, _),
    ):
        result = await trio.to_thread.run_sync(
            functools.partial(
                sdk_sample,
                url,
                model_path="tinker://run7/sampler_weights/step3",
                prompt=PROMPT,
                num_samples=2,
                max_tokens=8,
                seed=9,
            )
        )
        for i, seq in enumerate(result.sequences):
            assert seq.tokens == sample("run7_step3", PROMPT, 9, i, 8).tokens
        assert completions(engine) >= 1


async def test_abandoned_poll_and_resubmits_against_a_real_engine(fd_baseline: int) -> None:
    import httpx

    async with (
        open_engine(port=0, decode_ms_per_token=20) as engine,
        real_gateway(engine.url) as (url, app),
    ):
        async with httpx.AsyncClient(base_url=url, headers={"X-API-Key": "tml-dummy"}) as http:
            r = await http.post(
                "/api/v1/create_sampling_session",
                json={"session_id": "s", "sampling_session_seq_id": 0, "base_model": "sim-base"},
            )
            sampling_session = r.json()["sampling_session_id"]
            body = {
                "num_samples": 1,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
                "sampling_params": {"max_tokens": 30, "seed": 1},
                "sampling_session_id": sampling_session,
                "seq_id": 0,
            }
            ids = {
                (await http.post("/api/v1/asample", json=body)).json()["request_id"]
                for _ in range(3)
            }
            assert len(ids) == 1
            rid = ids.pop()
            with trio.move_on_after(0.1):  # the trainer gives up on this poll
                await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            await engine.stats.wait_for(lambda s: s.completed >= 1)
            assert engine.stats.aborted == 0
            first = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            again = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            assert first.status_code == again.status_code == 200
            assert first.content == again.content
            assert (await http.post("/api/v1/asample", json=body)).json()["request_id"] == rid
        assert completions(engine) == 1
        assert app.extensions["trioforward"].client.statistics().pool.active == 0


async def test_capabilities_and_health_through_the_sdk_rest_client(
    sdk_loop: None, fd_baseline: int
) -> None:
    import httpx

    async with open_engine(port=0) as engine, real_gateway(engine.url) as (url, _):
        async with httpx.AsyncClient(base_url=url) as http:
            caps = (await http.post("/api/v1/get_server_capabilities", json={})).json()
            names = {m["model_name"] for m in caps["supported_models"]}
            assert {"sim-base", "sim-base-2"} <= names
            assert (await http.get("/api/v1/healthz")).json() == {"status": "ok"}
            assert (await http.post("/api/v1/telemetry", json={"events": []})).json() == {
                "status": "accepted"
            }


def _compute_logprobs(url: str, prompt: list[int], last_n: int | None) -> list[float | None]:
    import tinker
    from tinker import types

    with tinker.ServiceClient(base_url=url, api_key="tml-dummy") as service:
        client = service.create_sampling_client(base_model="sim-base").result()
        result: list[float | None] = client.compute_logprobs(
            types.ModelInput.from_ints(prompt), prompt_logprobs_last_n=last_n
        ).result(timeout=60)
        return result


async def test_sdk_compute_logprobs_last_n(sdk_loop: None, fd_baseline: int) -> None:
    async with open_engine(port=0) as engine, real_gateway(engine.url) as (url, _):
        got = await trio.to_thread.run_sync(_compute_logprobs, url, PROMPT, 2)
        want = expected_prompt_logprobs("sim-base", PROMPT)
        assert got[:-2] == [None] * (len(PROMPT) - 2)
        for i in (len(PROMPT) - 2, len(PROMPT) - 1):
            assert math.isclose(got[i], want[i][str(PROMPT[i])]["logprob"], rel_tol=1e-6)


async def test_sdk_samples_on_sglang_and_on_a_mixed_fleet(sdk_loop: None, fd_baseline: int) -> None:
    # The sampling session's engine body is SGLang's /generate on an SGLang engine
    # (docs/dispatch.md, "Engine dialects"); the SDK cannot tell.
    async with (
        open_engine(port=0, kind="sglang") as sglang,
        open_engine(port=0) as vllm,
        real_gateway(sglang.url, vllm.url, routing="round-robin") as (url, app),
    ):
        client = app.extensions["trioforward"].client
        with trio.fail_after(10):
            for engine in (sglang, vllm):
                await client.engines.wait_kind(engine.url)
        for _ in range(2):
            result = await trio.to_thread.run_sync(
                functools.partial(
                    sdk_sample, url, base_model="sim-base", prompt=PROMPT, num_samples=2, max_tokens=6, seed=4
                )
            )
            for i, seq in enumerate(result.sequences):
                want = sample("sim-base", PROMPT, 4, i, 6)
                assert seq.tokens == want.tokens and seq.logprobs == want.logprobs
        assert sglang.stats.by_path["/generate"] == 1 and completions(sglang) == 0
        assert completions(vllm) == 1
