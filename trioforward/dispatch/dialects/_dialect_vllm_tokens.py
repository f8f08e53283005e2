"""vLLM's token-in/token-out dialect: ``POST /inference/v1/generate`` (vLLM 0.32
started with ``--enable-scale-out`` or ``--tokens-only``; docs/dispatch.md,
"Engine dialects").

Source: ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``
(``GenerateRequest``, ``GenerateTokensResponse``) and ``serving.py``.

Body: ``{"request_id", "token_ids", "model", "sampling_params": {"max_tokens",
"n", "temperature", "top_p", "top_k", "seed"?, "stop"?, "stop_token_ids"?,
"ignore_eos"?, "logprobs": 1?, "prompt_logprobs": 1?}, "stream": false}``
(``model`` names the adapter, as on ``/v1/completions``). Answer:
``{"request_id": "generate-tokens-<id>", "choices": [{"index", "finish_reason",
"stop_reason", "token_ids", "logprobs": {"content": [{"token_id", "logprob",
"rank", "top_logprobs"}]} | null, "weight_versions": [{"version", "start",
"end"}] | null}], "usage", "prompt_logprobs": [null, {"<id>": {"logprob", ...}}]}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from trioforward.codec import (
    Choice,
    CodecError,
    Completion,
    choices_doc,
    prompt_logprobs_array,
    weight_spans,
)
from trioforward.dispatch.dialects._dialect import TokenRequest, route_sampling_params

__all__ = ["PATH", "render", "parse"]

PATH = "/inference/v1/generate"
_EMPTY = np.zeros(0, dtype=np.int32)


def sampling_params(request: TokenRequest) -> dict[str, Any]:
    params = route_sampling_params(request, max_tokens="max_tokens", seed="seed")
    if request.logprobs:
        params["logprobs"] = 1
    if request.prompt_logprobs:
        params["prompt_logprobs"] = 1
    return params


def render(request: TokenRequest, engine_id: str) -> tuple[str, bytes]:
    body = {
        "request_id": engine_id,
        "token_ids": request.prompt,
        "model": request.model,
        "sampling_params": sampling_params(request),
        "stream": False,
    }
    return PATH, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _logprobs(block: Any) -> np.ndarray | None:
    if not isinstance(block, dict) or not isinstance(block.get("content"), list):
        return None
    values = [e.get("logprob") if isinstance(e, dict) else None for e in block["content"]]
    return np.array([np.nan if v is None else v for v in values], dtype=np.float32)


def parse(content: bytes, request: TokenRequest, weight_version: str | None = None) -> Completion:
    doc = choices_doc(content, "generate body")
    choices: list[Choice] = []
    for raw in doc["choices"]:
        ids = raw.get("token_ids") if isinstance(raw, dict) else None
        if not isinstance(ids, list):
            raise CodecError("a generate choice has no 'token_ids' list")
        tokens = np.array(ids, dtype=np.int32) if ids else _EMPTY
        spans, token_versions = weight_spans(raw.get("weight_versions"), len(tokens), weight_version)
        choices.append(
            Choice(
                index=int(raw.get("index", len(choices))),
                text="",
                tokens=tokens,
                logprobs=_logprobs(raw.get("logprobs")) if request.logprobs else None,
                finish_reason=raw.get("finish_reason") or "",
                stop_reason=raw.get("stop_reason"),
                weight_versions=spans,
                token_versions=token_versions,
            )
        )
    prompt_lp = None
    if isinstance(doc.get("prompt_logprobs"), list):
        prompt_lp = prompt_logprobs_array(doc["prompt_logprobs"], request.prompt)
    return Completion(
        id=str(doc.get("request_id", "")),
        model=str(doc.get("model") or request.model),
        choices=choices,
        usage=doc.get("usage") or {},
        prompt_logprobs=prompt_lp,
        raw=doc,
    )
