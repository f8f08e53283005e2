"""vLLM's ``/inference/v1/generate`` with ``return_tokens_as_token_ids``: vLLM 0.32
ignores it there and gives each logprob as ``{"token_id": <int>, ...}``
(tests/sim/vllm_0_32_fixtures/tokens_generate_tokens_as_ids.json); the gateway adds
``"token": "token_id:<id>"`` (the form of earlier releases, which renderers 0.1.12
reads) for a caller that asked, whole, streamed and continued, and relays every
other answer untouched (docs/server.md, "Token routes")."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
import pytest
import trio
from gateway_harness import open_gateway, open_sim
from test_token_routes_continue import across_an_update

from trioforward.dispatch.rollout import _continue_stream, _replay

PATH = "/inference/v1/generate"
PARAMS = {"max_tokens": 6, "logprobs": 1}
ASKS = [
    {"request_id": "mine", "token_ids": [1, 2, 3], "sampling_params": PARAMS, "return_tokens_as_token_ids": True},
    {"request_id": "mine", "token_ids": [1, 2, 3], "sampling_params": {**PARAMS, "return_tokens_as_token_ids": True}},
]


async def kinds(gw: Any) -> None:
    client = gw.state.client
    with trio.fail_after(10):
        for e in client.engines.list():
            await client.engines.wait_kind(e.url)


def entries(choices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for c in choices for e in (c["logprobs"] or {"content": []})["content"]]


def events(text: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e[6:]) for e in text.split(b"\n\n") if e and e != b"data: [DONE]"]


def assert_named(choices: list[dict[str, Any]], count: int) -> None:
    """Every logprob entry (and top logprob) has vLLM 0.32's fields and the token string."""
    found = entries(choices)
    assert len(found) == count == len([t for c in choices for t in c["token_ids"]])
    for entry, token in zip(found, [t for c in choices for t in c["token_ids"]], strict=True):
        assert entry["token"] == f"token_id:{token}" and entry["token_id"] == token
        assert isinstance(entry["logprob"], float) and entry["rank"] >= 1
        assert entry["top_logprobs"] and all(t["token"] == f"token_id:{t['token_id']}" for t in entry["top_logprobs"])


@pytest.fixture
def rewrites(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each call of the answer rewrite, whole (False) or streamed (True)."""
    calls: list[bool] = []
    for module in (_replay, _continue_stream):
        real = module.token_strings

        def counted(content: bytes, stream: bool, real: Any = real) -> bytes:
            calls.append(stream)
            return real(content, stream)

        monkeypatch.setattr(module, "token_strings", counted)
    return calls


@pytest.mark.parametrize("ask", ASKS, ids=["top-level", "sampling_params"])
async def test_an_asking_call_gets_token_strings_and_others_pass_through_as_they_are(
    fd_baseline: int, rewrites: list[bool], ask: dict[str, Any]
) -> None:
    plain = {k: v for k, v in ask.items() if k != "return_tokens_as_token_ids"}
    plain["sampling_params"] = PARAMS
    async with open_sim(scale_out=True) as engine, open_gateway(engine.url) as gw:
        await kinds(gw)
        before = engine.stats.by_path[PATH]  # the kind detection's POST {}
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            asked = await c.post(PATH, json=ask)
            asked_stream = await c.post(PATH, json={**ask, "stream": True})
            assert rewrites.count(False) == 1 and True in rewrites  # the answer, each relayed block
            seen = len(rewrites)
            passed = await c.post(PATH, json=plain)
            passed_stream = await c.post(PATH, json={**plain, "stream": True})
            assert len(rewrites) == seen  # nothing read on the fast path
            direct = await c.post(engine.url + PATH, json=ask)
            direct_plain = await c.post(engine.url + PATH, json=plain)
            direct_stream = await c.post(engine.url + PATH, json={**plain, "stream": True})
        assert engine.stats.by_path[PATH] - before == 7  # one engine request per call
        assert {r.status_code for r in (asked, asked_stream, passed, passed_stream)} == {200}
        doc = asked.json()
        assert_named(doc["choices"], 6)
        # The engine's own answer to the same ask: vLLM 0.32's shape, no token string.
        want = direct.json()
        assert all("token" not in e for e in entries(want["choices"]))
        for got_entry, want_entry in zip(entries(doc["choices"]), entries(want["choices"]), strict=True):
            named = {k: v for k, v in got_entry.items() if k != "token"}
            named["top_logprobs"] = [{k: v for k, v in t.items() if k != "token"} for t in named["top_logprobs"]]
            assert named == want_entry
        assert_named([ch for e in events(asked_stream.content) for ch in e["choices"]], 6)
        assert asked_stream.content.endswith(b"data: [DONE]\n\n")
        # Not asked: the engine's bytes (the whole answer's "created" is its second).
        created = re.compile(rb'"created":\d+')
        assert created.sub(b"", passed.content) == created.sub(b"", direct_plain.content)
        assert b'"token":' not in passed.content
        assert passed_stream.content == direct_stream.content
        assert await gw.pool_active() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_continued_answer_has_token_strings_on_every_segment(fd_baseline: int, stream: bool) -> None:
    budget = 300  # 3 s of decoding: the pause lands mid-generation
    body = {
        "token_ids": [1, 2, 3],
        "sampling_params": {"max_tokens": budget, "logprobs": 1},
        "return_tokens_as_token_ids": True,
        "stream": stream,
    }
    async with open_sim(decode_ms_per_token=10, scale_out=True) as engine, open_gateway(engine.url) as gw:
        await kinds(gw)
        before = engine.stats.by_path[PATH]
        out: list[bytes] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

            async def one() -> None:
                async with c.stream("POST", PATH, json=body) as r:
                    assert r.status_code == 200
                    out.extend([chunk async for chunk in r.aiter_bytes()])

            await across_an_update(c, engine, one)
        text = b"".join(out)
        choices = [ch for e in events(text) for ch in e["choices"]] if stream else orjson.loads(text)["choices"]
        assert_named(choices, budget)
        spans = [s for ch in choices for s in ch["weight_versions"] or []]
        assert [s["version"] for s in spans] == ["v1", "v2"]
        assert engine.stats.by_path[PATH] - before == 2  # the first attempt and one continuation
        assert engine.stats.tokens_decoded == budget  # nothing decoded twice
        assert await gw.pool_active() == 0
