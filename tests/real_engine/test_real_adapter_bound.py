"""The gateway's bound on loaded adapters (``max_loaded_adapters``) against a live
vLLM started with ``--max-loras 2``: unload, reload, every sample succeeds.

vLLM's ``--max-loras`` limits the adapters in one batch, not how many are loaded:
its API server accepts a third load and lists every adapter until it is unloaded
(docs/compatibility.md). So what this proves is the gateway's side: with
``max_loaded_adapters=2`` and four adapters sampled in turn, the gateway unloads
the least recently used one through ``POST /v1/unload_lora_adapter``, so vLLM's
``/v1/models`` never lists more than two of them between rounds; each later
request reloads its adapter and succeeds, and a reloaded adapter answers exactly
as it did the first time (temperature 0).

No ``prompt_logprobs`` here: on a LoRA engine vLLM 0.32 CPU crashes on them.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
from conftest import Server
from vllm_probes import PROMPT_IDS

import trioforward

BOUND = 2
ROUNDS = 3
# Names no other test uses, so vLLM's log and /v1/models speak only of this test.
ADAPTERS = {
    "bound_a1": "loras/a1",
    "bound_a2": "loras/a2",
    "bound_a3": "loras/a3",
    "bound_a4": "tinker/run1/step4",
}
LOADED = "Loaded new LoRA adapter: name '{}'"
REMOVED = "Removed LoRA adapter: name '{}'"


async def listed(http: httpx.AsyncClient, engine: Server) -> set[str]:
    """This test's adapters among those vLLM lists in ``GET /v1/models``."""
    reply = await http.get(engine.url + "/v1/models")
    assert reply.status_code == 200, reply.text
    return {m["id"] for m in reply.json()["data"]} & ADAPTERS.keys()


async def test_adapter_bound_unload_reload_every_sample_succeeds(
    vllm_lora: Server, workdir: Path
) -> None:
    first: dict[str, tuple[list[int], np.ndarray]] = {}
    async with (
        trioforward.open_client(engines=[vllm_lora.url], max_loaded_adapters=BOUND) as client,
        httpx.AsyncClient(timeout=60) as http,
    ):
        for name, path in ADAPTERS.items():
            client.adapters.register(name, str(workdir / path))
        assert await listed(http, vllm_lora) == set()
        for round_ in range(ROUNDS):
            for name in ADAPTERS:  # in turn: each request finds its adapter unloaded
                completion = await client.complete(
                    model=name, prompt=PROMPT_IDS, max_tokens=8, temperature=0.0
                )
                (choice,) = completion.choices
                assert len(choice.tokens) == 8 and choice.logprobs is not None
                tokens = choice.tokens.tolist()
                if round_ == 0:
                    first[name] = (tokens, choice.logprobs)
                else:  # reloaded: the same adapter as the first time
                    assert tokens == first[name][0], (name, round_)
                    np.testing.assert_allclose(choice.logprobs, first[name][1], atol=1e-4)
            on_engine = await listed(http, vllm_lora)
            (kept,) = client.statistics().adapters_loaded.values()
            assert len(on_engine) <= BOUND, (round_, on_engine)
            assert on_engine == set(kept) == {"bound_a3", "bound_a4"}, round_
        stats = client.statistics()
    # Every request missed: 4 loads a round; all but the last two were unloaded.
    assert list(stats.adapter_loads.values()) == [len(ADAPTERS) * ROUNDS]
    assert list(stats.adapter_unloads.values()) == [len(ADAPTERS) * ROUNDS - BOUND]
    for name in ADAPTERS:
        assert vllm_lora.count(LOADED.format(name)) == ROUNDS, name
        kept_at_end = name in {"bound_a3", "bound_a4"}
        assert vllm_lora.count(REMOVED.format(name)) == ROUNDS - kept_at_end, name
    # The logprobs tell the adapters apart, so a reload of the wrong one would show.
    logprobs = [lp for _, lp in first.values()]
    for i, a in enumerate(logprobs):
        for b in logprobs[i + 1 :]:
            assert not np.allclose(a, b, atol=1e-4)
