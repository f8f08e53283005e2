"""verifiers 0.4.0, unchanged, against the gateway (docs/compatibility.md, "The RL
stacks' own clients").

- The eval client: what ``vf-eval``'s interception server runs for a harness's
  streamed ``/v1/chat/completions`` call — ``EvalClient.relay`` to the provider,
  then ``_collect_stream`` (the chat dialect's stream parser and its strict
  response model) — eight calls in flight across an abort pause with
  ``replay: "continue"``: no call fails, none is redone (the sim decoded each
  token once), every answer has all its tokens.
- The train client's token route: ``renderers.client.generate`` (what the
  ``TrainClient`` posts to ``/inference/v1/generate``) with
  ``return_tokens_as_token_ids`` in its sampling params: through the gateway,
  renderers accepts the answer (the gateway adds ``"token": "token_id:<id>"``);
  straight to the sim, which answers as vLLM 0.32 does, renderers refuses it.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import httpx
import pytest
from conftest import SimTokenizer, access_statuses, wait_stats
from openai import AsyncOpenAI
from renderers.client import MalformedGenerateResponseError, generate
from renderers.default import DefaultRenderer
from verifiers.v1.clients.eval import EvalClient
from verifiers.v1.configs.client import EvalClientConfig
from verifiers.v1.dialects import ChatDialect
from verifiers.v1.interception.server import _collect_stream

CALLS = 8
BUDGET = 60


def _chat_body(i: int) -> dict[str, Any]:
    return {
        "model": "sim-base",
        "messages": [{"role": "user", "content": f"Reverse the text: call {i}"}],
        "max_tokens": BUDGET,
        "stream": True,
    }


def test_eval_client_streams_chat_across_an_abort_continue_pause(launch: Any) -> None:
    sim = launch("sim-engine", "--model", "sim-base", "--decode-ms-per-token", "20")
    gateway = launch("serve", "--engine", sim.url, "--log-level", "info")
    dialect = ChatDialect()
    answers: list[Any] = []

    def calls() -> None:
        async def one(client: EvalClient, i: int) -> Any:
            reply = await client.relay(dialect, _chat_body(i), session_id=f"rollout-{i}")
            response, _ = await _collect_stream(dialect, reply)
            return response

        async def all_of() -> list[Any]:
            client = EvalClient(EvalClientConfig(base_url=gateway.url + "/v1", api_key_var="NO_SUCH_KEY_VAR"))
            try:
                return await asyncio.gather(*(one(client, i) for i in range(CALLS)), return_exceptions=True)
            finally:
                await client.close()

        answers.extend(asyncio.run(all_of()))

    runner = threading.Thread(target=calls)
    runner.start()
    wait_stats(sim, lambda s: s["running"] == CALLS and s["tokens_decoded"] >= 3 * CALLS)
    pause = httpx.post(gateway.url + "/admin/pause", json={"engine_mode": "abort", "replay": "continue"}, timeout=60)
    assert pause.status_code == 200, pause.text
    assert httpx.post(gateway.url + "/admin/resume", json={"weight_version": "v1"}, timeout=60).status_code == 200
    runner.join(timeout=120)
    assert not runner.is_alive()

    failed = [a for a in answers if isinstance(a, BaseException)]
    assert failed == [] and len(answers) == CALLS
    for response in answers:
        assert response.finish_reason == "length"
        assert len(re.findall(r" t\d+", response.message.content)) == BUDGET  # the sim's tokens
    stats = sim.stats()
    assert stats["pauses"] == {"abort": 1} and stats["resumes"] == 1
    assert stats["pause_aborted"] == CALLS
    # Nothing redone: each call's tokens were decoded once, half before the pause
    # and the rest in its one continuation (a call redone whole decodes them twice).
    assert stats["tokens_decoded"] == CALLS * BUDGET
    # verifiers' client names each call's session (X-Session-ID), so each call is an
    # agent session turn: its messages rendered once by the engine's /tokenize, sent
    # as a token completion, and continued as one (docs/sessions.md).
    assert "/v1/chat/completions" not in stats["by_path"]
    assert stats["by_path"]["/tokenize"] == CALLS
    assert stats["by_path"]["/v1/completions"] == 2 * CALLS  # each turn and its continuation
    assert access_statuses(gateway, at_least=CALLS) == [200] * CALLS


def _renderer() -> Any:
    return DefaultRenderer(SimTokenizer())


@pytest.mark.parametrize("target", ["gateway", "engine"])
def test_train_client_token_route_is_served_by_the_gateway_not_by_vllm_0_32(launch: Any, target: str) -> None:
    sim = launch("sim-engine", "--model", "sim-base", "--enable-scale-out")
    gateway = launch("serve", "--engine", sim.url, "--log-level", "info")
    url = gateway.url if target == "gateway" else sim.url
    before = sim.stats()  # the gateway's own probe of the token route is counted here
    # What verifiers' sampling config (extra keys allowed) hands renderers: its
    # sampling_params, sent as the body's "sampling_params" (renderers 0.1.12 has no
    # top-level field for it).
    params = {"max_tokens": 8, "temperature": 0, "return_tokens_as_token_ids": True}

    async def one() -> Any:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="anything")
        try:
            return await generate(
                client=client,
                renderer=_renderer(),
                messages=[],
                model="sim-base",
                prompt_ids=[1, 2, 3],
                sampling_params=params,
            )
        finally:
            await client.close()

    if target == "gateway":
        # The gateway adds the earlier releases' "token": "token_id:<id>" to vLLM
        # 0.32's entries for a caller that asked: renderers accepts the answer.
        result = asyncio.run(one())
        assert len(result["completion_ids"]) == 8 == len(result["completion_logprobs"])
        assert all(lp <= 0 for lp in result["completion_logprobs"])
    else:
        # vLLM 0.32's token route gives each logprob as {"token_id": <int>, ...}
        # and ignores the ask (recorded: tests/sim/vllm_0_32_fixtures/
        # tokens_generate_tokens_as_ids.json); renderers 0.1.12 refuses it.
        with pytest.raises(MalformedGenerateResponseError, match=r"content\[0\]\.token must be 'token_id:\d+'"):
            asyncio.run(one())
    stats = sim.stats()
    assert stats["by_path"]["/inference/v1/generate"] - before["by_path"]["/inference/v1/generate"] == 1
    assert stats["completed"] - before["completed"] == 1
    answered = httpx.post(
        url + "/inference/v1/generate",
        json={"token_ids": [1, 2, 3], "sampling_params": {**params, "logprobs": 1}},
        timeout=30,
    ).json()
    entry = answered["choices"][0]["logprobs"]["content"][0]
    assert entry["token_id"] == answered["choices"][0]["token_ids"][0]
    if target == "gateway":
        assert entry["token"] == f"token_id:{entry['token_id']}"
    else:
        assert "token" not in entry
    expected = [200, 200] if target == "gateway" else []
    assert access_statuses(gateway, at_least=len(expected)) == expected
