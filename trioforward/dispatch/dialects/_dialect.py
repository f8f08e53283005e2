"""The dialect seam: the gateway's token-level request, and which engine body it
becomes (docs/dispatch.md, "Engine dialects").

A :class:`TokenRequest` is what the gateway itself asks of an engine (Tinker
samples, ``client.complete()``, a continuation after an abort): prompt token
ids, sampling parameters, the token budget, an adapter, an id. Each engine
dialect is one module with two functions, and nothing outside them knows which
engine it talks to:

- ``render(request, engine_id) -> (path, body bytes)``: the engine's request;
- ``parse(status 2xx body bytes, request, weight_version) -> Completion``: the answer back as
  the gateway's own (``trioforward.codec.Completion``: per choice ``tokens``
  int32, ``logprobs`` float32, ``finish_reason`` "stop" | "length" | "abort",
  ``stop_reason``, ``weight_versions`` spans — the engine's, else one span under
  ``weight_version``, the version the gateway dispatched it under; ``usage``;
  ``prompt_logprobs``).
  Raises :class:`~trioforward.codec.CodecError` for a body it cannot read.

| dialect module | engine | route |
|---|---|---|
| ``_dialect_completions`` | vLLM without a token route, ``openai`` engines, engines of unknown kind | ``POST /v1/completions`` with ``return_token_ids`` |
| ``_dialect_vllm_tokens`` | vLLM serving ``/inference/v1/generate`` | ``POST /inference/v1/generate`` |
| ``_dialect_sglang`` | SGLang | ``POST /generate`` with ``input_ids``, ``return_logprob`` |

:func:`dialect_for` picks the module by the engine's kind (``_kinds.py``); a
request rendered for one engine and retried on another is rendered again, with
a fresh engine-side id (:func:`engine_request_id`) on every attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trioforward.codec import Completion
    from trioforward.dispatch.engines._engines import Engine

__all__ = ["TokenRequest", "Dialect", "dialect_for", "route_sampling_params"]


@dataclass(slots=True)
class TokenRequest:
    """One token-level sampling request.

    ``model``: the base model's or an adapter's name (SGLang gets an adapter
    as ``lora_path``); ``prompt``: token ids; ``max_tokens``: the budget (new
    tokens per sample); ``n``: samples; ``top_k``: -1 = all; ``seed``: None =
    engine's choice; ``stop``: strings; ``stop_token_ids``: ids; ``ignore_eos``:
    do not stop at EOS; ``logprobs``: return each sampled token's logprob;
    ``prompt_logprobs``: return the prompt tokens' logprobs; ``request_id``: the
    caller's id, if any (the engine gets a fresh one per attempt);
    ``adapter``: ``model`` is a registered LoRA adapter (set by the client);
    ``extra``: more fields for the ``/v1/completions`` dialect only (the
    ``**extra`` of ``client.complete()``).
    """

    model: str
    prompt: list[int]
    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: bool = True
    prompt_logprobs: bool = False
    request_id: str | None = None
    adapter: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Dialect(Protocol):
    """What a dialect module provides (module-level functions)."""

    def render(self, request: TokenRequest, engine_id: str) -> tuple[str, bytes]: ...

    def parse(
        self, content: bytes, request: TokenRequest, weight_version: str | None = None
    ) -> Completion: ...


def dialect_for(engine: Engine) -> Dialect:
    """The dialect module for ``engine``: by its kind and token route."""
    from trioforward.dispatch.dialects import (
        _dialect_completions,
        _dialect_sglang,
        _dialect_vllm_tokens,
    )

    if engine.kind == "sglang":
        return _dialect_sglang
    if engine.kind == "vllm" and engine.token_route:
        return _dialect_vllm_tokens
    return _dialect_completions


def route_sampling_params(request: TokenRequest, *, max_tokens: str, seed: str) -> dict[str, Any]:
    """The ``sampling_params`` both engines' token routes take, the budget and the
    seed under the route's own names (SGLang ``/generate``: ``max_new_tokens``,
    ``sampling_seed``; vLLM ``/inference/v1/generate``: ``max_tokens``, ``seed``);
    the fields left unset are left out."""
    params: dict[str, Any] = {
        max_tokens: request.max_tokens,
        "n": request.n,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
    }
    if request.seed is not None:
        params[seed] = request.seed
    if request.stop is not None:
        params["stop"] = request.stop
    if request.stop_token_ids is not None:
        params["stop_token_ids"] = request.stop_token_ids
    if request.ignore_eos:
        params["ignore_eos"] = True
    return params
