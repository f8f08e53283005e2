"""The dialect seam: client.complete() and client.sample() render the token-level
request in the dialect of the engine each attempt goes to (docs/dispatch.md,
"Engine dialects")."""

from __future__ import annotations

import numpy as np
import trio
from dispatch_testing import client_for

from trioforward.dispatch import Client, TokenRequest
from trioforward.sim import expected_completion, open_engine


async def known(client: Client) -> None:
    with trio.fail_after(10):
        for e in client.engines.list():
            await client.engines.wait_kind(e.url)


async def test_complete_on_sglang_sends_generate_with_input_ids(fd_baseline: int) -> None:
    async with open_engine(kind="sglang") as engine, client_for(engine) as client:
        await known(client)
        c = await client.complete(model="sim-base", prompt=[1, 2, 3], max_tokens=4, seed=9)
        tokens, logprobs, _ = expected_completion("sim-base", [1, 2, 3], 9, 0, 4)
        assert c.choices[0].tokens.tolist() == tokens
        assert np.allclose(c.choices[0].logprobs, logprobs)
        assert c.choices[0].finish_reason == "length"
        assert c.choices[0].weight_versions == [{"version": "default", "start": 0, "end": 4}]
        assert c.usage["completion_tokens"] == 4
        assert engine.stats.by_path["/generate"] == 1 and engine.stats.by_path["/v1/completions"] == 0
        assert engine.stats.by_seed[9] == 1  # sent as sampling_seed (SGLang has no seed key)


async def test_sample_on_vllm_with_the_token_route(fd_baseline: int) -> None:
    async with open_engine(scale_out=True) as engine, client_for(engine) as client:
        await known(client)
        request = TokenRequest(model="sim-base", prompt=[4, 5], max_tokens=3, n=2, seed=1)
        c = await client.sample(request)
        assert [ch.tokens.tolist() for ch in c.choices] == [
            expected_completion("sim-base", [4, 5], 1, i, 3)[0] for i in range(2)
        ]
        # one POST {} (400: the kind detection finding the route), one generation
        assert engine.stats.by_path["/inference/v1/generate"] == 2 and engine.stats.completed == 1


async def test_a_mixed_fleet_answers_alike_in_three_dialects(
    fd_baseline: int,
) -> None:
    async with (
        open_engine(kind="sglang") as sglang,
        open_engine(scale_out=True) as vllm,
        open_engine() as plain,
        client_for(sglang, vllm, plain, routing="round-robin") as client,
    ):
        await known(client)
        seen = set()
        for _ in range(6):
            c = await client.complete(model="sim-base", prompt=[7, 8], max_tokens=3, seed=3)
            assert c.choices[0].tokens.tolist() == expected_completion("sim-base", [7, 8], 3, 0, 3)[0]
            seen.add(c.engine)
        assert seen == {sglang.url, vllm.url, plain.url}
        assert sglang.stats.by_path["/generate"] == 2
        assert vllm.stats.by_path["/inference/v1/generate"] == 1 + 2  # the detection's POST {}
        assert plain.stats.by_path["/v1/completions"] == 2
