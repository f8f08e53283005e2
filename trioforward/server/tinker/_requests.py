"""Tinker request bodies -> what the engine is asked, and sampling session identity.

Sans-IO: parses the SDK's JSON (unknown fields are ignored, as newer SDKs send
more) and builds the vLLM ``/v1/completions`` body once, as bytes, so an
outstanding sample costs its prompt in JSON form and nothing else.

Sampling session ids are self-describing (``"s-" + base64url(JSON)``): a gateway
that restarted, or a second gateway behind the same address, still knows which
model a sampling session names, so a trainer's ``asample`` never fails on an id the
gateway forgot.
"""

from __future__ import annotations

import base64
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from trioforward.dispatch import TokenRequest, WeightPolicy
from trioforward.server.base._errors import RequestError

if TYPE_CHECKING:
    from trioforward.server.front._asgi import Call

__all__ = [
    "BadRequest",
    "SamplingSession",
    "SampleJob",
    "make_sampling_session",
    "sampling_session_from_id",
    "parse_sample",
    "adapter_for_path",
]


class BadRequest(RequestError):
    """The SDK's request cannot be served: a 400 ``invalid_request`` (terminal for the SDK)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message, code="invalid_request")


@dataclass(frozen=True, slots=True)
class SamplingSession:
    """A sampling session. ``model`` is the engine's model name (base or adapter)."""

    sampler_id: str
    base_model: str
    model_path: str | None
    model: str
    adapter_path: str | None  # set when ``model`` is an adapter loaded from this path


@dataclass(slots=True)
class SampleJob:
    """One ``asample``, ready to forward: ``tokens`` the token-level request (sent in
    the dialect of the engine it goes to, docs/dispatch.md, "Engine dialects"),
    ``body`` its ``/v1/completions`` JSON, encoded once."""

    model: str
    body: bytes
    session: str  # X-Session-ID "<sampling_session_id>:<seq_id>"
    num_samples: int
    prompt_logprobs_last_n: int | None  # NaN out prompt logprobs before the last n
    # Identity (docs/tinker.md, "Request ids and rollout groups"): the caller's
    # X-Request-Id, else the future's id; the X-Rollout-Group header.
    request_id: str | None = None
    group: str | None = None
    tokens: TokenRequest | None = None
    tenant: Any = None  # the dispatch Tenant of the caller's API key (None: the default)
    # The X-Weight-Policy header (docs/operations.md, "Which weights a request accepts").
    policy: WeightPolicy | None = None


_TINKER = "tinker://"


def adapter_for_path(
    model_path: str, adapter_root: str, registered: set[str] | dict[str, str]
) -> tuple[str, str | None]:
    """``(engine model name, adapter path or None)`` for a sampling session's ``model_path``.

    - a registered adapter name, bare or as ``tinker://NAME``: that adapter;
    - ``tinker://RUN/sampler_weights/NAME``: adapter ``RUN_NAME`` at
      ``<adapter_root>/RUN/NAME`` (to be registered with the dispatch core, which
      loads it on the engines on demand). ``adapter_root`` must be absolute: the
      engines resolve the path on their side.

    Raises :class:`BadRequest` for anything else, and for a relative ``adapter_root``.
    """
    name = model_path[len(_TINKER) :] if model_path.startswith(_TINKER) else model_path
    if name in registered:
        return name, None
    parts = name.split("/")
    if model_path.startswith(_TINKER) and len(parts) == 3 and parts[1] == "sampler_weights":
        run, _, weights = parts
        for part in (run, weights):
            if not part or part in (".", "..") or "\\" in part:
                raise BadRequest(f"model_path {model_path!r}: bad path segment {part!r}")
        if not os.path.isabs(adapter_root):
            # The engine resolves lora_path on its own side (its own working
            # directory, maybe another machine): a relative root means nothing there.
            raise BadRequest(
                f"model_path {model_path!r} names weights under adapter_root, which is the "
                f"relative path {adapter_root!r}: set adapter_root (--adapter-root / "
                "TRIOFORWARD_ADAPTER_ROOT) to an absolute directory the engines can read"
            )
        return f"{run}_{weights}", os.path.join(adapter_root, run, weights)
    raise BadRequest(
        f"model_path {model_path!r} is neither a registered adapter nor "
        "tinker://RUN/sampler_weights/NAME"
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def make_sampling_session(
    session_id: str,
    seq: int,
    base_model: str | None,
    model_path: str | None,
    adapter_root: str,
    registered: set[str] | dict[str, str],
) -> SamplingSession:
    """The sampling session a ``create_sampling_session`` asks for (same inputs -> same id)."""
    if base_model is not None and not isinstance(base_model, str):
        raise BadRequest("base_model must be a string")
    if model_path is not None and not isinstance(model_path, str):
        raise BadRequest("model_path must be a string")
    if not base_model and not model_path:
        raise BadRequest("create_sampling_session needs base_model or model_path")
    ident = _b64(orjson.dumps([session_id, seq, base_model, model_path]))
    return _sampling_session("s-" + ident, base_model, model_path, adapter_root, registered)


def _sampling_session(
    sampler_id: str,
    base_model: str | None,
    model_path: str | None,
    adapter_root: str,
    registered: set[str] | dict[str, str],
) -> SamplingSession:
    if model_path:
        model, adapter_path = adapter_for_path(model_path, adapter_root, registered)
    else:
        assert base_model
        model, adapter_path = base_model, None
    # The SDK only uses base_model to pick a tokenizer; an adapter named without
    # its base answers with the adapter's own name.
    return SamplingSession(sampler_id, base_model or model, model_path, model, adapter_path)


def sampling_session_from_id(
    sampler_id: str, adapter_root: str, registered: set[str] | dict[str, str]
) -> SamplingSession | None:
    """Decode a sampling session id made by :func:`make_sampling_session`; ``None`` if it is not one."""
    if not sampler_id.startswith("s-"):
        return None
    raw = sampler_id[2:]
    try:
        fields = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        _, _, base_model, model_path = fields
    except (ValueError, TypeError):
        return None
    if not (base_model is None or isinstance(base_model, str)) or not (
        model_path is None or isinstance(model_path, str)
    ):
        return None
    try:
        return _sampling_session(sampler_id, base_model, model_path, adapter_root, registered)
    except BadRequest:
        return None


def _int(params: dict[str, Any], name: str, default: int | None) -> int | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer")
    return value


def _float(params: dict[str, Any], name: str, default: float) -> float:
    value = params.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise BadRequest(f"{name} must be a number")
    return float(value)


def _prompt_tokens(prompt: Any) -> list[int]:
    if not isinstance(prompt, dict) or not isinstance(prompt.get("chunks"), list):
        raise BadRequest("prompt must be {'chunks': [...]}")
    tokens: list[int] = []
    for chunk in prompt["chunks"]:
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text" or not isinstance(chunk.get("tokens"), list):
            raise BadRequest(
                f"prompt chunks of type {kind!r} are not supported (only encoded_text)"
            )
        tokens.extend(chunk["tokens"])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BadRequest("prompt tokens must be integers")
    return tokens


_UNSUPPORTED = ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k")


def parse_sample(request: dict[str, Any], sampling_session: SamplingSession) -> SampleJob:
    """The engine request for one ``asample`` body. Raises :class:`BadRequest`.

    Engine body (vLLM ``/v1/completions``): ``model``, ``prompt`` = token ids,
    ``n``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``,
    ``stop`` (strings) or ``stop_token_ids`` (ints; ``[]`` = ignore EOS, the SDK's
    "disable every stop token"), ``logprobs: 1`` (an integer: some routers reject
    ``true``), ``return_token_ids``, ``prompt_logprobs: 1`` when asked, ``stream``.
    """
    num_samples = _int(request, "num_samples", 1)
    if num_samples is None or num_samples < 1:
        raise BadRequest("num_samples must be >= 1")
    for name in _UNSUPPORTED:
        if request.get(name):
            raise BadRequest(f"{name} is not supported by this gateway")
    if request.get("target_prompt_logprobs") is not None:
        raise BadRequest("target_prompt_logprobs is not supported by this gateway")
    tokens = _prompt_tokens(request.get("prompt"))
    params = request.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    body: dict[str, Any] = {
        "model": sampling_session.model,
        "prompt": tokens,
        "n": num_samples,
        "temperature": _float(params, "temperature", 1.0),
        "top_p": _float(params, "top_p", 1.0),
        "top_k": _int(params, "top_k", -1),
        "logprobs": 1,
        "return_token_ids": True,
        "stream": False,
    }
    max_tokens = _int(params, "max_tokens", None)
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    seed = _int(params, "seed", None)
    if seed is not None:
        body["seed"] = seed
    stop = params.get("stop")
    if isinstance(stop, str):
        body["stop"] = [stop]
    elif isinstance(stop, list):
        if not stop:
            body["ignore_eos"] = True
        elif all(isinstance(s, str) for s in stop):
            body["stop"] = stop
        elif all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
            body["stop_token_ids"] = stop
        else:
            raise BadRequest("stop must be strings or token ids, not a mix")
    elif stop is not None:
        raise BadRequest("stop must be a string or a list")
    last_n = None
    if request.get("prompt_logprobs"):
        body["prompt_logprobs"] = 1
        last_n = _int(request, "prompt_logprobs_last_n", None)
        if last_n is not None and not 1 <= last_n < max(len(tokens), 2):
            raise BadRequest("prompt_logprobs_last_n must be between 1 and len(prompt) - 1")
    session = f"{sampling_session.sampler_id}:{request.get('seq_id')}"
    token_request = TokenRequest(
        model=body["model"],
        prompt=tokens,
        max_tokens=body.get("max_tokens", 16),
        n=num_samples,
        temperature=body["temperature"],
        top_p=body["top_p"],
        top_k=body["top_k"],
        seed=body.get("seed"),
        stop=body.get("stop"),
        stop_token_ids=body.get("stop_token_ids"),
        ignore_eos=bool(body.get("ignore_eos")),
        prompt_logprobs=bool(body.get("prompt_logprobs")),
    )
    return SampleJob(sampling_session.model, orjson.dumps(body), session, num_samples, last_n, tokens=token_request)


def identify(job: SampleJob, future_id: str, call: Call) -> None:
    """Give a new sample its request id and rollout group (docs/tinker.md, "Request
    ids and rollout groups"): the caller's ``X-Request-Id``, else the future's id,
    so an abort by ``request_ids`` takes the ids the SDK's futures carry."""
    job.request_id = call.log.request_id if b"x-request-id" in call.headers else future_id
    job.group = call.log.group


def id_header(future_id: str, call: Call) -> tuple[tuple[bytes, bytes], ...]:
    """The ``X-Request-Id`` of an ``asample`` answer: the sample's request id."""
    request_id = call.log.request_id if b"x-request-id" in call.headers else future_id
    return ((b"x-request-id", (request_id or future_id).encode()),)

