"""The embedded client (trioforward.open_client) against a live vLLM: the same
tokens and logprobs as vLLM's own answer to the request it sends."""

from __future__ import annotations

import httpx
import numpy as np
from conftest import Server
from vllm_probes import MODEL, PROMPT_IDS

import trioforward


async def test_embedded_client_complete_equals_vllms_answer(vllm_base: Server) -> None:
    params = {"max_tokens": 8, "n": 2, "temperature": 0.7, "seed": 5}
    async with trioforward.open_client(engines=[vllm_base.url]) as client:
        completion = await client.complete(model=MODEL, prompt=PROMPT_IDS, **params)
    body = {"model": MODEL, "prompt": PROMPT_IDS, "return_token_ids": True, "logprobs": 1, **params}
    async with httpx.AsyncClient(timeout=60) as http:
        direct = (await http.post(vllm_base.url + "/v1/completions", json=body)).json()
    assert len(completion.choices) == 2
    for mine, theirs in zip(completion.choices, direct["choices"], strict=True):
        assert mine.tokens.dtype == np.int32 and mine.tokens.tolist() == theirs["token_ids"]
        assert mine.logprobs is not None
        want = np.array(theirs["logprobs"]["token_logprobs"], dtype=np.float32)
        np.testing.assert_allclose(mine.logprobs, want, rtol=1e-4, atol=1e-4)
