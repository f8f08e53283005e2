"""The openai SDK through the gateway gets vLLM's own answer for the same request.

Requests go one at a time (the same batch on the engine, so the same floats)
and are deterministic: temperature 0, or the same seed.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from conftest import Server
from vllm_probes import MODEL, PROMPT_IDS


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="anything", max_retries=0)


def same_answer(via_gateway: Any, direct: Any) -> None:
    """Equal but for the response id and time and the gateway's one addition (a
    choice's ``weight_versions`` span over its token ids, when the caller asked for
    them and the gateway has recorded a version; docs/operations.md); logprobs to
    float32 precision."""
    mine, theirs = via_gateway.model_dump(), direct.model_dump()
    for body in (mine, theirs):
        body.pop("id"), body.pop("created")
    for choice in mine.get("choices", []):
        if "weight_versions" in choice and "weight_versions" not in (theirs["choices"][0] or {}):
            (span,) = choice.pop("weight_versions")
            assert (span["start"], span["end"]) == (0, len(choice["token_ids"]))
    _close(mine, theirs)


def _close(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-4), path
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_completions_token_ids_n2_logprobs_prompt_logprobs_token_ids(
    gateway_base: Server, vllm_base: Server
) -> None:
    request: dict[str, Any] = dict(
        model=MODEL,
        prompt=PROMPT_IDS,
        n=2,
        seed=11,
        temperature=0.8,
        max_tokens=8,
        logprobs=2,
        extra_body={"prompt_logprobs": 1, "return_token_ids": True},
    )
    direct = client(vllm_base).completions.create(**request)
    via = client(gateway_base).completions.create(**request)
    same_answer(via, direct)
    first = via.model_dump()["choices"][0]
    assert len(via.choices) == 2 and first["prompt_token_ids"] == PROMPT_IDS
    assert len(first["token_ids"]) == 8 and len(first["logprobs"]["tokens"]) == 8
    assert first["prompt_logprobs"][0] is None and len(first["prompt_logprobs"]) == len(PROMPT_IDS)


def test_completions_stop_string(gateway_base: Server, vllm_base: Server) -> None:
    base: dict[str, Any] = dict(model=MODEL, prompt="Hello, how are you?", temperature=0, max_tokens=24)
    free = client(vllm_base).completions.create(**base).choices[0].text
    stop = free[len(free) // 2 :][:2]  # a string the free answer reaches halfway
    assert stop.strip(), f"no stop string in {free!r}"
    direct = client(vllm_base).completions.create(**base, stop=[stop])
    via = client(gateway_base).completions.create(**base, stop=[stop])
    same_answer(via, direct)
    choice = via.model_dump()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert stop not in choice["text"] and free.startswith(choice["text"])


def test_chat_with_logprobs(gateway_base: Server, vllm_base: Server) -> None:
    request: dict[str, Any] = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello, how are you?"}],
        temperature=0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
    )
    direct = client(vllm_base).chat.completions.create(**request)
    via = client(gateway_base).chat.completions.create(**request)
    same_answer(via, direct)
    assert len(via.choices[0].logprobs.content) == via.usage.completion_tokens == 8  # type: ignore[union-attr]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_stream_with_usage_equals_the_whole_answer(
    gateway_base: Server, vllm_base: Server, chat: bool
) -> None:
    common: dict[str, Any] = dict(model=MODEL, temperature=0, max_tokens=12)
    if chat:
        whole = client(vllm_base).chat.completions.create(
            messages=[{"role": "user", "content": "Hi"}], **common
        )
        chunks = list(
            client(gateway_base).chat.completions.create(
                messages=[{"role": "user", "content": "Hi"}],
                stream=True,
                stream_options={"include_usage": True},
                **common,
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
    else:
        whole = client(vllm_base).completions.create(prompt=PROMPT_IDS, **common)
        chunks = list(
            client(gateway_base).completions.create(
                prompt=PROMPT_IDS,
                stream=True,
                stream_options={"include_usage": True},
                **common,
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens,  # type: ignore[union-attr]
        whole.usage.completion_tokens,  # type: ignore[union-attr]
    )
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
