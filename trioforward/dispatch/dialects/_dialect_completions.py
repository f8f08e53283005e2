"""The ``/v1/completions`` dialect (vLLM's ``return_token_ids`` extension), for
engines without a token route of their own (docs/dispatch.md, "Engine dialects").

Body: ``model``, ``prompt`` (token ids), ``max_tokens``, ``n``, ``temperature``,
``top_p``, ``top_k``, ``seed``, ``stop``, ``stop_token_ids``, ``ignore_eos``,
``logprobs: 1`` (an integer: some routers refuse ``true``), ``prompt_logprobs: 1``,
``return_token_ids: true``, then the request's ``extra`` (vLLM
``vllm/entrypoints/openai/completion/protocol.py``). Answer: the completion,
decoded by ``trioforward.codec`` with ``token_ids`` required (an engine that
ignores ``return_token_ids`` would hand a trainer samples without tokens).
The engine-side id is not sent (``/v1/completions`` has no id field).
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.codec import Completion, decode_completion
from trioforward.dispatch.dialects._dialect import TokenRequest, route_sampling_params

__all__ = ["PATH", "body", "render", "parse"]

PATH = "/v1/completions"


def body(request: TokenRequest) -> dict[str, Any]:
    """The JSON body (optional fields only when set; ``extra`` last)."""
    out: dict[str, Any] = {"model": request.model, "prompt": request.prompt}
    out.update(route_sampling_params(request, max_tokens="max_tokens", seed="seed"))
    if request.top_p == 1.0:
        del out["top_p"]
    if request.top_k == -1:
        del out["top_k"]
    out["return_token_ids"] = True
    if request.logprobs:
        out["logprobs"] = 1
    if request.prompt_logprobs:
        out["prompt_logprobs"] = 1
    out.update(request.extra)
    return out


def render(request: TokenRequest, engine_id: str) -> tuple[str, bytes]:
    return PATH, orjson.dumps(body(request), option=orjson.OPT_SERIALIZE_NUMPY)


def parse(content: bytes, request: TokenRequest, weight_version: str | None = None) -> Completion:
    return decode_completion(content, require_token_ids=True, weight_version=weight_version)
