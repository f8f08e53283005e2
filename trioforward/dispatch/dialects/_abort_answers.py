"""The answer of a request aborted where no engine gave one, in its route's shape
(docs/operations.md, "Over-sampling: cancelling a round's stragglers").

A request aborted on an engine that has an abort route answers with the
engine's own body (the tokens decoded so far). One aborted while QUEUED never
reached an engine, and one on an engine without an abort route (or that did not
end it in time) was cut by closing its connection: both get the answer the
engine gives a request aborted before it produced anything, made here; a stream
cut mid-way gets the tail the engine ends an aborted stream with, then
``data: [DONE]``.

- vLLM 0.32 ``/v1/completions`` and ``/v1/chat/completions``
  (``vllm/entrypoints/openai/completion/serving.py``, ``chat_completion/serving.py``):
  every choice empty, ``finish_reason: "abort"``, ``token_ids: []``; a stream's
  tail is one such event per choice.
- SGLang ``/generate`` (0.5.23, ``srt/managers/tokenizer_manager.py``, a request
  aborted in the waiting queue): ``{"text": "", "output_ids": [], "meta_info":
  {"id", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
  "completion_tokens": 0, "e2e_latency"}}``, a list of them (prompt-major,
  sample-minor) for a batch or ``n > 1``; in a stream each item is one event
  (with ``index`` in a batch). The ids are the caller's ``rid`` (a batch's: the
  list's, or ``<rid>_<i>``), else the request id.
- vLLM ``/inference/v1/generate`` (``.../token_in_token_out/protocol.py``): every
  choice empty, ``finish_reason: "abort"``; in a stream one event per choice;
  ``request_id`` is ``generate-tokens-<request id>``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from trioforward.dispatch.dialects._routes import SGLANG, VLLM

__all__ = ["abort_body", "abort_tail", "prompt_count", "generate_items"]

_NULLS = ("routed_experts", "sampling_mask", "weight_versions", "logprobs")


def _body(content: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(content) if content else {}
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _n(params: Any) -> int:
    n = params.get("n", 1) if isinstance(params, dict) else 1
    return n if type(n) is int and 0 < n <= 1024 else 1


def _batch(data: dict[str, Any]) -> int:
    """How many prompts an SGLang body's batch holds (0: a single prompt)."""
    ids, text = data.get("input_ids"), data.get("text")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return len(text) if "input_ids" not in data and isinstance(text, list) else 0


def prompt_count(content: bytes) -> int:
    """How many prompts a ``/v1/completions`` body holds (1 unless a batch)."""
    prompt = _body(content).get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        return len(prompt)  # a batch: one choice per prompt and sample
    return 1


def generate_items(content: bytes) -> tuple[int, bool]:
    """``(items, listed)`` of an SGLang ``/generate`` body: how many prompts a batch
    holds (0: one prompt) and whether its ``rid`` is a list."""
    data = _body(content)
    return _batch(data), isinstance(data.get("rid"), list)


def _parts(path: str, content: bytes, request_id: str) -> tuple[Any, list[dict[str, Any]]]:
    """``(whole answer, stream events)`` of an aborted request with nothing generated."""
    data = _body(content)
    model = data.get("model") if isinstance(data.get("model"), str) else ""
    if path == SGLANG:
        prompts, n, rid = _batch(data), _n(data.get("sampling_params")), data.get("rid")
        if isinstance(rid, list):
            ids = [str(r) for r in rid]
        else:
            base = rid if isinstance(rid, str) and rid else request_id
            ids = [f"{base}_{i}" for i in range(prompts)] if prompts and n == 1 else [base]
        reason = {"type": "abort", "message": "Abort in waiting queue"}
        items: list[dict[str, Any]] = []
        for i in range(max(prompts, 1) * n):
            meta: dict[str, Any] = {"id": ids[i] if i < len(ids) else ids[0] if ids else request_id}
            meta.update(finish_reason=reason, completion_tokens=0, e2e_latency=0.0)
            items.append({"text": "", "output_ids": [], "meta_info": meta})
        many = bool(prompts) or n > 1
        return (items if many else items[0]), [{**t, "index": i} if many else t for i, t in enumerate(items)]
    head: dict[str, Any]
    choices: list[dict[str, Any]]
    if path == VLLM:
        choices = [
            {"index": i, "finish_reason": "abort", "stop_reason": None, "token_ids": [], **dict.fromkeys(_NULLS)}
            for i in range(_n(data.get("sampling_params")))
        ]
        head = {"request_id": f"generate-tokens-{request_id}"}
        use = {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0, "prompt_tokens_details": None}
        body: dict[str, Any] = {**head, "model": model, "created": int(time.time()), "usage": use}
        body.update(prompt_logprobs=None, output_mode="tokens", choices=choices)
        return body, [{**head, "usage": None, "output_mode": "tokens", "choices": [c]} for c in choices]
    chat = path.endswith("/chat/completions")
    n = _n(data)
    count = n if chat else n * prompt_count(content)
    kind = ("chatcmpl-", "chat.completion") if chat else ("cmpl-", "text_completion")
    head = {"id": kind[0] + request_id, "object": kind[1], "created": int(time.time()), "model": model}
    end: dict[str, Any] = {"finish_reason": "abort", "stop_reason": None, "token_ids": []}
    message: dict[str, Any] = {"message": {"role": "assistant", "content": ""}} if chat else {"text": ""}
    delta: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
    choices = [{"index": i, "logprobs": None, **message, **end} for i in range(count)]
    use = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    body = {**head, "choices": choices, "usage": use}
    if chat:
        head = {**head, "object": "chat.completion.chunk"}
    return body, [{**head, "choices": [{"index": i, "logprobs": None, **delta, **end}]} for i in range(count)]


def abort_body(path: str, content: bytes, request_id: str) -> bytes:
    """A whole 200 answer of route ``path`` for request body ``content``: every
    choice empty, ``finish_reason`` abort."""
    return orjson.dumps(_parts(path, content, request_id)[0])


def abort_tail(path: str, content: bytes, request_id: str) -> bytes:
    """The end of an SSE stream: one abort event per choice, then ``data: [DONE]``
    (the whole stream, for one never started)."""
    events = _parts(path, content, request_id)[1]
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
