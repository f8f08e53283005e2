"""The answer of a token-route request aborted where no engine gave one
(:mod:`._abort_answer` for the OpenAI routes; docs/operations.md, "Over-sampling:
cancelling a round's stragglers").

- SGLang ``/generate`` (0.5.23, ``srt/managers/tokenizer_manager.py``, a request
  aborted in the waiting queue): ``{"text": "", "output_ids": [], "meta_info":
  {"id", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
  "completion_tokens": 0, "e2e_latency"}}``, no ``prompt_tokens``; a list of
  them (prompt-major, sample-minor) for a batch or ``n > 1``; in a stream each
  item is one event (with ``index`` in a batch), then ``data: [DONE]``. The ids
  are the caller's ``rid`` (a batch's: the list's, or ``<rid>_<i>``), else the
  request id.
- vLLM ``/inference/v1/generate`` (0.32,
  ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``): the whole
  answer with every choice empty, ``finish_reason: "abort"``; in a stream one
  event per choice, then ``data: [DONE]``; ``request_id`` is
  ``generate-tokens-<request id>``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

__all__ = ["PATHS", "batch_size", "abort_body", "abort_tail"]

SGLANG = "/generate"
VLLM = "/inference/v1/generate"
PATHS = frozenset({SGLANG, VLLM})


def batch_size(data: dict[str, Any]) -> int:
    """How many prompts an SGLang body's batch holds (0: a single prompt)."""
    ids, text = data.get("input_ids"), data.get("text")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    if "input_ids" not in data and isinstance(text, list):
        return len(text)
    return 0


def _n(params: Any) -> int:
    n = params.get("n", 1) if isinstance(params, dict) else 1
    return n if type(n) is int and 0 < n <= 1024 else 1


def _sglang_items(data: dict[str, Any], request_id: str) -> tuple[list[dict[str, Any]], bool]:
    prompts = batch_size(data)
    n = _n(data.get("sampling_params"))
    rid = data.get("rid")
    if isinstance(rid, list):
        ids = [str(r) for r in rid]
    else:
        base = rid if isinstance(rid, str) and rid else request_id
        ids = [f"{base}_{i}" for i in range(prompts)] if prompts and n == 1 else [base]
    count = max(prompts, 1) * n
    items = []
    for i in range(count):
        meta = {
            "id": ids[i] if i < len(ids) else ids[0] if ids else request_id,
            "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
            "completion_tokens": 0,
            "e2e_latency": 0.0,
        }
        items.append({"text": "", "output_ids": [], "meta_info": meta})
    return items, bool(prompts) or n > 1


def _vllm_choice(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "finish_reason": "abort",
        "stop_reason": None,
        "token_ids": [],
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": None,
        "logprobs": None,
    }


def abort_body(path: str, data: dict[str, Any], request_id: str) -> bytes:
    if path == SGLANG:
        items, many = _sglang_items(data, request_id)
        return orjson.dumps(items if many else items[0])
    model = data.get("model")
    body = {
        "request_id": f"generate-tokens-{request_id}",
        "model": model if isinstance(model, str) else "",
        "created": int(time.time()),
        "usage": {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0, "prompt_tokens_details": None},
        "prompt_logprobs": None,
        "output_mode": "tokens",
        "choices": [_vllm_choice(i) for i in range(_n(data.get("sampling_params")))],
    }
    return orjson.dumps(body)


def abort_tail(path: str, data: dict[str, Any], request_id: str) -> bytes:
    events = []
    if path == SGLANG:
        items, many = _sglang_items(data, request_id)
        for i, item in enumerate(items):
            if many:
                item["index"] = i
            events.append(b"data: " + orjson.dumps(item) + b"\n\n")
    else:
        rid = f"generate-tokens-{request_id}"
        for i in range(_n(data.get("sampling_params"))):
            event = {"request_id": rid, "usage": None, "output_mode": "tokens", "choices": [_vllm_choice(i)]}
            events.append(b"data: " + orjson.dumps(event) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)
