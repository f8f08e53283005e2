"""AReaL 1.0.4's remote engines, unchanged, against the gateway (docs/compatibility.md,
"The RL stacks' own clients").

- ``RemoteSGLangEngine``: ``agenerate`` calls in flight over two SGLang sims while
  the trainer runs its own weight update — ``pause_generation()``,
  ``update_weights_from_disk()``, ``continue_generation()`` — to the gateway's
  address: every engine paused, pushed and resumed once, the calls in flight
  finish whole on the new weights, nothing answers 404.
- ``RemotevLLMEngine``: ``agenerate`` over a vLLM sim, sending no ``model`` and
  ``return_tokens_as_token_ids``; AReaL parses the ``"token_id:<id>"`` tokens itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from areal.api import ModelRequest, WeightUpdateMeta
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig, NameResolveConfig
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.engine.vllm_remote import RemotevLLMEngine
from areal.utils import name_resolve, names
from conftest import access_statuses, wait_stats

BUDGET = 60


def _config(tmp_path: Path, backend: str) -> InferenceEngineConfig:
    name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=str(tmp_path / "names")))
    return InferenceEngineConfig(
        experiment_name="clients",
        trial_name="t0",
        backend=f"{backend}:d1",
        request_timeout=60,
        pause_grace_period=0.0,
    )


def _request(i: int) -> ModelRequest:
    gconfig = GenerationHyperparameters(max_new_tokens=BUDGET, greedy=True)
    return ModelRequest(rid=f"r{i}", input_ids=[1, 2, 3 + i], gconfig=gconfig)


def test_remote_sglang_engine_updates_weights_through_the_gateway_with_calls_in_flight(
    launch: Any, tmp_path: Path
) -> None:
    sims = [launch("sim-engine", "--kind", "sglang", "--model", "sim-base", "--decode-ms-per-token", "20") for _ in range(2)]
    gateway = launch("serve", *(a for s in sims for a in ("--engine", s.url)), "--log-level", "info")
    engine = RemoteSGLangEngine(_config(tmp_path, "sglang"))
    engine.initialize(addr=gateway.url.removeprefix("http://"))
    results: list[Any] = []

    def rollouts() -> None:
        async def all_of() -> list[Any]:
            return await asyncio.gather(*(engine.agenerate(_request(i)) for i in range(4)))

        results.extend(asyncio.run(all_of()))

    try:
        runner = threading.Thread(target=rollouts)
        runner.start()
        for sim in sims:
            wait_stats(sim, lambda s: s["running"] >= 1 and s["tokens_decoded"] >= 3)
        engine.pause_generation()
        name_resolve.add(names.update_weights_from_disk("clients", "t0", 0), str(time.time()))
        engine.update_weights_from_disk(WeightUpdateMeta(type="disk", path=str(tmp_path / "ckpt-1"))).result(
            timeout=60
        )
        engine.continue_generation()
        runner.join(timeout=120)
        assert not runner.is_alive()
    finally:
        engine.destroy()
    assert len(results) == 4
    for response in results:
        assert response.stop_reason == "length" and len(response.output_tokens) == BUDGET
    for sim in sims:
        stats = sim.stats()
        assert stats["by_path"]["/pause_generation"] == 1
        assert stats["by_path"]["/update_weights_from_disk"] == 1
        assert stats["by_path"]["/continue_generation"] == 1
        assert stats["pauses"] == {"abort": 1} and stats["resumes"] == 1
    assert 404 not in access_statuses(gateway)


def test_remote_vllm_engine_parses_token_ids_through_the_gateway(launch: Any, tmp_path: Path) -> None:
    sim = launch("sim-engine", "--model", "sim-base")
    gateway = launch("serve", "--engine", sim.url, "--log-level", "info")
    engine = RemotevLLMEngine(_config(tmp_path, "vllm"))
    engine.initialize(addr=gateway.url.removeprefix("http://"))
    try:

        async def one() -> Any:
            return await engine.agenerate(_request(0))

        response = asyncio.run(one())
    finally:
        engine.destroy()
    # The sim's tokens for this prompt, asked of it directly (its outputs are a
    # function of model and prompt: docs/sim.md, "Deterministic outputs").
    direct = {"model": "sim-base", "prompt": [1, 2, 3], "max_tokens": BUDGET, "return_token_ids": True}
    expected = httpx.post(sim.url + "/v1/completions", json=direct, timeout=30).json()
    assert response.output_tokens == expected["choices"][0]["token_ids"]
    assert len(response.output_logprobs) == BUDGET
    stats = sim.stats()
    assert stats["by_model"] == {"sim-base": 2} and stats["completed"] == 2  # AReaL's, and ours
    assert access_statuses(gateway, at_least=1) == [200]
