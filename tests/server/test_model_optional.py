"""``model`` left out of /v1/completions and /v1/chat/completions: the one served
base model, as vLLM (docs/server.md, "When `model` is left out")."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import httpx
import pytest
from gateway_harness import generation_requests, open_gateway, open_sim

PROMPT = {"prompt": [1, 2, 3], "max_tokens": 3}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.mark.parametrize("model", ["absent", None, ""])
async def test_a_body_without_model_runs_on_the_one_served_model(fd_baseline: int, model: object) -> None:
    extra = {} if model == "absent" else {"model": model}
    async with open_sim(models=("sim-base",), adapters={"lora-a": "/a"}) as engine, open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            done = await c.post("/v1/completions", json={**PROMPT, **extra})
            chat = await c.post("/v1/chat/completions", json={**CHAT, **extra})
            stream = await c.post("/v1/completions", json={**PROMPT, **extra, "stream": True})
        assert done.status_code == 200, done.text
        assert done.json()["model"] == "sim-base"
        assert chat.status_code == 200 and chat.json()["model"] == "sim-base"
        assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
        # The engine was asked for the model by name, once per request.
        assert engine.stats.by_model == {"sim-base": 3}
        assert await gw.pool_active() == 0


async def test_without_model_several_served_models_is_a_400_naming_them(
    fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_sim(models=("model-a",)))
        b = await stack.enter_async_context(open_sim(models=("model-b",)))
        gw = await stack.enter_async_context(open_gateway(a.url, b.url))
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            with caplog.at_level(logging.INFO, logger="trioforward.access"):
                refused = await c.post("/v1/completions", json=PROMPT)
            wrong = await c.post("/v1/completions", json={**PROMPT, "model": 7})
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "model" and "'model-a', 'model-b'" in error["message"]
        assert refused.headers["x-request-id"]
        assert "POST /v1/completions 400" in caplog.text  # the access log says what it got
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "model"
        assert generation_requests(a) + generation_requests(b) == 0
