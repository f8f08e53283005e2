"""``POST /tokenize`` answers in vLLM's shape with the ids the chat route prompts with."""

from __future__ import annotations

import httpx

from trioforward.sim import SimEngine, tokenize


async def test_tokenize_messages_gives_the_chat_routes_prompt(engine: SimEngine) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    async with httpx.AsyncClient(base_url=engine.url) as client:
        tok = (await client.post("/tokenize", json={"messages": messages})).json()
        chat = await client.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 3, "return_token_ids": True},
        )
    assert tok == {
        "count": len(tok["tokens"]),
        "max_model_len": 32768,
        "tokens": tokenize("system: be brief\nuser: hi\n"),
        "token_strs": None,
    }
    assert chat.json()["prompt_token_ids"] == tok["tokens"]
    assert list(engine.stats.prompts) == [tok["tokens"]]
    assert engine.stats.sampled[-1] == [chat.json()["choices"][0]["token_ids"]]


async def test_tokenize_prompt_and_bad_bodies(engine: SimEngine) -> None:
    async with httpx.AsyncClient(base_url=engine.url) as client:
        ok = (
            await client.post("/tokenize", json={"prompt": "ab", "return_token_strs": True})
        ).json()
        no_messages = await client.post("/tokenize", json={"messages": []})
        not_json = await client.post("/tokenize", content=b"{")
    assert ok["tokens"] == [97, 98] and ok["token_strs"] == [" t97", " t98"]
    assert no_messages.status_code == 400 and "messages" in no_messages.text
    assert not_json.status_code == 400
    assert engine.stats.completed == 0
