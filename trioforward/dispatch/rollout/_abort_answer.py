"""The answer of a request aborted by the caller's abort call where no engine gave one.

docs/operations.md, "Over-sampling: cancelling a round's stragglers". A request
aborted on an engine that has an abort route answers with the engine's own
body (``finish_reason: "abort"``, the tokens decoded so far). One aborted while
QUEUED never reached an engine, and one on an engine without an abort route (or
that did not end it in time) was cut by closing its connection: both get the
answer vLLM gives a request aborted before it produced anything, made here —
every choice empty, ``finish_reason: "abort"``, ``token_ids: []``. A stream cut
mid-way gets the tail vLLM ends an aborted stream with: one event per choice
with ``finish_reason: "abort"``, then ``data: [DONE]``.

Shapes: vLLM 0.32 ``/v1/completions`` and ``/v1/chat/completions``
(``vllm/entrypoints/openai/completion/serving.py``, ``chat_completion/serving.py``).
The engines' own token routes get their own (:mod:`._abort_answer_native`):
SGLang's waiting-queue abort on ``/generate``, vLLM's token route's abort on
``/inference/v1/generate``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from trioforward.dispatch.rollout import _abort_answer_native as native

__all__ = ["abort_body", "abort_tail", "prompt_count", "generate_items"]


def _body(content: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(content) if content else {}
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _prompts(data: dict[str, Any]) -> int:
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        return len(prompt)  # a batch: one choice per prompt and sample
    return 1


def prompt_count(content: bytes) -> int:
    """How many prompts a ``/v1/completions`` body holds (1 unless a batch)."""
    return _prompts(_body(content))


def _shape(path: str, content: bytes) -> tuple[bool, int, str]:
    """``(chat, choices, model)`` of a request body (defaults when unreadable)."""
    chat = path.endswith("/chat/completions")
    data = _body(content)
    n = data.get("n", 1)
    n = n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1024 else 1
    prompts = 1 if chat else _prompts(data)
    model = data.get("model")
    return chat, n * prompts, model if isinstance(model, str) else ""


def generate_items(content: bytes) -> tuple[int, bool]:
    """``(items, listed)`` of an SGLang ``/generate`` body: how many prompts a batch
    holds (0: one prompt) and whether its ``rid`` is a list."""
    data = _body(content)
    return native.batch_size(data), isinstance(data.get("rid"), list)


def abort_body(path: str, content: bytes, request_id: str) -> bytes:
    """A whole 200 answer: every choice empty, ``finish_reason: "abort"``."""
    if path in native.PATHS:
        return native.abort_body(path, _body(content), request_id)
    chat, choices, model = _shape(path, content)
    out: list[dict[str, Any]] = []
    for index in range(choices):
        choice: dict[str, Any] = {"index": index, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": ""}
        else:
            choice["text"] = ""
        choice.update(finish_reason="abort", stop_reason=None, token_ids=[])
        out.append(choice)
    body = {
        "id": ("chatcmpl-" if chat else "cmpl-") + request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": out,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
    return orjson.dumps(body)


def abort_tail(path: str, content: bytes, request_id: str) -> bytes:
    """The end of an SSE stream: one ``finish_reason: "abort"`` event per choice,
    then ``data: [DONE]`` (the whole stream, for one never started)."""
    if path in native.PATHS:
        return native.abort_tail(path, _body(content), request_id)
    chat, choices, model = _shape(path, content)
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
    }
    events = []
    for index in range(choices):
        choice: dict[str, Any] = {"index": index, "logprobs": None}
        if chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        choice.update(finish_reason="abort", stop_reason=None, token_ids=[])
        events.append(b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)
