"""SGLang's native dialect: ``POST /generate`` with ``input_ids`` (docs/dispatch.md,
"Engine dialects").

Source: SGLang 0.5.23 ``srt/managers/io_struct.py`` (``GenerateReqInput``),
``srt/sampling/sampling_params.py`` (the only ``sampling_params`` keys it
accepts: an unknown one is a 400, so a seed goes as ``sampling_seed``),
``srt/managers/tokenizer_manager.py`` (answers).

Body: ``{"rid", "input_ids", "sampling_params": {"max_new_tokens", "n",
"temperature", "top_p", "top_k", "sampling_seed"?, "stop"?, "stop_token_ids"?,
"ignore_eos"?}, "return_logprob", "logprob_start_len", "lora_path"?, "stream":
false}`` — ``lora_path`` is the adapter's *name* (the base model is not named).
Answer: one object (``n = 1``) or a list in sample order, each ``{"text",
"output_ids", "meta_info": {"id", "finish_reason": {"type": "stop" | "length" |
"abort", "matched"?}, "prompt_tokens", "completion_tokens", "weight_version",
"weight_versions"?, "output_token_logprobs": [[logprob, id, text|null], ...],
"input_token_logprobs"?}}``. ``output_ids`` ends with the stop token, as vLLM's
``token_ids``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from trioforward.codec import Choice, CodecError, Completion, weight_spans
from trioforward.dispatch.dialects._dialect import TokenRequest, route_sampling_params

__all__ = ["PATH", "render", "parse"]

PATH = "/generate"
_EMPTY = np.zeros(0, dtype=np.int32)


def render(request: TokenRequest, engine_id: str) -> tuple[str, bytes]:
    params = route_sampling_params(request, max_tokens="max_new_tokens", seed="sampling_seed")
    body: dict[str, Any] = {
        "rid": engine_id,
        "input_ids": request.prompt,
        "sampling_params": params,
        "return_logprob": request.logprobs or request.prompt_logprobs,
        # -1: output positions only; 0: from the first prompt token
        "logprob_start_len": 0 if request.prompt_logprobs else -1,
        "stream": False,
    }
    if request.adapter:
        body["lora_path"] = request.model
    return PATH, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _floats(entries: Any) -> np.ndarray:
    if not isinstance(entries, list):
        return np.zeros(0, dtype=np.float32)
    values = [e[0] if isinstance(e, list) and e else None for e in entries]
    return np.array([np.nan if v is None else v for v in values], dtype=np.float32)


def _choice(
    index: int, item: Any, request: TokenRequest, version: str | None
) -> tuple[Choice, dict[str, Any]]:
    if not isinstance(item, dict) or not isinstance(item.get("output_ids"), list):
        raise CodecError("a /generate answer has no 'output_ids' list")
    meta_info = item.get("meta_info")
    meta: dict[str, Any] = meta_info if isinstance(meta_info, dict) else {}
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else None
    ids = item["output_ids"]
    tokens = np.array(ids, dtype=np.int32) if ids else _EMPTY
    logprobs = _floats(meta.get("output_token_logprobs")) if request.logprobs else None
    reported = meta.get("weight_version")
    spans, token_versions = weight_spans(
        meta.get("weight_versions"), len(tokens), reported if isinstance(reported, str) else version
    )
    choice = Choice(
        index=index,
        text=str(item.get("text") or ""),
        tokens=tokens,
        logprobs=logprobs,
        finish_reason=str(kind or ""),
        stop_reason=reason.get("matched") if isinstance(reason, dict) else None,
        weight_versions=spans,
        token_versions=token_versions,
    )
    return choice, meta


def parse(content: bytes, request: TokenRequest, weight_version: str | None = None) -> Completion:
    try:
        doc = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"/generate body is not JSON: {exc}") from None
    items = doc if isinstance(doc, list) else [doc]
    choices: list[Choice] = []
    metas: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        choice, meta = _choice(i, item, request, weight_version)
        choices.append(choice)
        metas.append(meta)
    first = metas[0] if metas else {}
    prompt_tokens = int(first.get("prompt_tokens") or len(request.prompt))
    completion_tokens = sum(int(m.get("completion_tokens") or 0) for m in metas)
    prompt_lp = None
    if request.prompt_logprobs and isinstance(first.get("input_token_logprobs"), list):
        prompt_lp = _floats(first["input_token_logprobs"])
    return Completion(
        id=str(first.get("id", "")),
        model=request.model,
        choices=choices,
        usage={
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        prompt_logprobs=prompt_lp,
        raw={"answers": items},
    )
