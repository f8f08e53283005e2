"""The official tinker SDK through the gateway, against a live vLLM: base model,
an adapter the gateway loads (16 concurrent first requests, exactly one load),
an adapter vLLM's filesystem resolver loads, and a base model vLLM does not know.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import httpx
import pytest
from conftest import Server
from vllm_probes import MODEL, PROMPT_IDS

LOADED = "Loaded new LoRA adapter: name '{}'"
RESOLVED = "Resolved and loaded LoRA adapter '{}'"


def sampling_client(gateway_lora: Server, **model: str) -> Any:
    import tinker

    service = tinker.ServiceClient(base_url=gateway_lora.url, api_key="tml-anything")
    return service.create_sampling_client(**model).result()


def submit(client: Any, seed: int) -> Future[Any]:
    from tinker import types

    return client.sample(  # type: ignore[no-any-return]
        prompt=types.ModelInput.from_ints(PROMPT_IDS),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=8, temperature=0.7, seed=seed),
    )


def direct(engine: Server, model: str, seed: int) -> list[list[int]]:
    """What vLLM answers for the request the gateway makes of one sample call."""
    body = {
        "model": model,
        "prompt": PROMPT_IDS,
        "n": 2,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": 1,
        "return_token_ids": True,
        "max_tokens": 8,
        "seed": seed,
    }
    reply = httpx.post(engine.url + "/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return [c["token_ids"] for c in reply.json()["choices"]]


def test_base_model(gateway_lora: Server, vllm_lora: Server) -> None:
    result = submit(sampling_client(gateway_lora, base_model=MODEL), seed=3).result(timeout=120)
    assert [s.tokens for s in result.sequences] == direct(vllm_lora, MODEL, 3)
    assert all(len(s.logprobs) == 8 for s in result.sequences)


def test_adapter_vllm_never_saw_16_first_requests_one_load(
    gateway_lora: Server, vllm_lora: Server
) -> None:
    name = "run1_step1"
    assert vllm_lora.count(LOADED.format(name)) == 0
    client = sampling_client(gateway_lora, model_path="tinker://run1/sampler_weights/step1")
    futures = [submit(client, seed=100 + i) for i in range(16)]
    results = [f.result(timeout=180) for f in futures]
    assert vllm_lora.count(LOADED.format(name)) == 1  # the seed race: one load for 16
    models = httpx.get(vllm_lora.url + "/v1/models").json()["data"]
    assert [m["parent"] for m in models if m["id"] == name] == [MODEL]
    assert [s.tokens for s in results[0].sequences] == direct(vllm_lora, name, 100)
    assert direct(vllm_lora, name, 100) != direct(vllm_lora, MODEL, 100)  # the adapter counts


def test_adapter_found_by_vllms_resolver_is_not_loaded_by_the_gateway(
    gateway_lora: Server, vllm_lora: Server
) -> None:
    name = "run2_step1"  # in VLLM_LORA_RESOLVER_CACHE_DIR, not under the gateway's adapter_root
    loads = vllm_lora.count('"POST /v1/load_lora_adapter HTTP/1.1"')
    client = sampling_client(gateway_lora, model_path="tinker://run2/sampler_weights/step1")
    result = submit(client, seed=7).result(timeout=120)
    assert vllm_lora.count(RESOLVED.format(name)) == 1
    assert vllm_lora.count('"POST /v1/load_lora_adapter HTTP/1.1"') == loads
    assert [s.tokens for s in result.sequences] == direct(vllm_lora, name, 7)


def test_unknown_base_model_404_is_passed_through_once(gateway_lora: Server, vllm_lora: Server) -> None:
    import openai

    needle = '"POST /v1/completions HTTP/1.1" 404'
    before = vllm_lora.count(needle)
    oa = openai.OpenAI(base_url=gateway_lora.url + "/v1", api_key="anything", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        oa.completions.create(model="nope", prompt=PROMPT_IDS, max_tokens=4)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["type"] == "NotFoundError" and error["param"] == "model"
    assert "The model `nope` does not exist." in error["message"]
    assert vllm_lora.count(needle) == before + 1  # one attempt on the engine, no retry
