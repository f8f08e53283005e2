"""The OpenAI API through the gateway, driven by the real ``openai`` SDK (pinned 3.57.0)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import trio
from gateway_harness import Gateway, generation_requests


def sdk(gateway: Gateway, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, **kw)


async def direct(engine: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        response = await client.post(engine.url + path, json=body)
    data: dict[str, Any] = response.json()
    return data


async def test_completion_matches_the_engine_answer(engine: Any, gateway: Gateway) -> None:
    async with sdk(gateway) as client:
        completion = await client.completions.create(
            model="sim-base", prompt="hello there", max_tokens=8, n=2, seed=7
        )
    expected = await direct(engine, "/v1/completions", {
        "model": "sim-base", "prompt": "hello there", "max_tokens": 8, "n": 2, "seed": 7,
    })
    assert [c.text for c in completion.choices] == [c["text"] for c in expected["choices"]]
    assert completion.usage is not None and completion.usage.completion_tokens == expected["usage"]["completion_tokens"]
    assert engine.stats.by_path["/v1/completions"] == 2  # one through the gateway, one direct
    assert await gateway.pool_active() == 0


async def test_token_id_prompt_and_raw_body_is_forwarded_verbatim(engine: Any, gateway: Gateway) -> None:
    body = {"model": "sim-base", "prompt": [1, 2, 3, 4], "max_tokens": 4, "seed": 1, "logprobs": 1}
    async with httpx.AsyncClient() as client:
        response = await client.post(gateway.url + "/v1/completions", content=orjson.dumps(body))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    expected = await direct(engine, "/v1/completions", body)
    assert response.json()["choices"] == expected["choices"]


async def test_chat_completion(engine: Any, gateway: Gateway) -> None:
    async with sdk(gateway) as client:
        chat = await client.chat.completions.create(
            model="sim-base", messages=[{"role": "user", "content": "hi"}], max_tokens=6, seed=3
        )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content
    assert engine.stats.by_path["/v1/chat/completions"] == 1


async def test_streaming_completion_relays_every_chunk(engine: Any, gateway: Gateway) -> None:
    async with sdk(gateway) as client:
        stream = await client.completions.create(
            model="sim-base", prompt="stream me", max_tokens=12, seed=5, stream=True
        )
        text = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
    expected = await direct(engine, "/v1/completions", {
        "model": "sim-base", "prompt": "stream me", "max_tokens": 12, "seed": 5,
    })
    assert text == expected["choices"][0]["text"]
    with trio.fail_after(5):
        await engine.stats.wait_for(lambda s: s.completed == 2)
    assert await gateway.pool_active() == 0


async def test_streaming_chat_ends_with_done(engine: Any, gateway: Gateway) -> None:
    body = {"model": "sim-base", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "stream": True}
    async with httpx.AsyncClient() as client:
        async with client.stream("POST", gateway.url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = b"".join([chunk async for chunk in response.aiter_bytes()])
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert all(e.startswith(b"data: ") for e in events)
    async with sdk(gateway) as client:
        stream = await client.chat.completions.create(
            model="sim-base", messages=[{"role": "user", "content": "x"}], max_tokens=5, stream=True
        )
        deltas = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(deltas)
    assert generation_requests(engine) == 2


async def test_models_lists_engine_models(engine: Any, gateway: Gateway) -> None:
    async with sdk(gateway) as client:
        page = await client.models.list()
    ids = {m.id for m in page.data}
    assert "sim-base" in ids
