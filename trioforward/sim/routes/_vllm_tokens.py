"""The simulated vLLM's token route: ``POST /inference/v1/generate`` and
``POST /inference/v1/abort_requests`` (served with ``scale_out=True``, as vLLM 0.32
with ``--enable-scale-out``; docs/sim.md, "Token routes").

Shapes from vLLM 0.32 ``vllm/entrypoints/scale_out/token_in_token_out/``
(``protocol.py``: ``GenerateRequest``, ``GenerateTokensResponse``,
``GenerateTokensStreamResponse``; ``serving.py``; ``api_router.py``):

- body ``{"request_id"?, "token_ids" (≥ 1 id, none negative), "sampling_params":
  {"max_tokens", "n", "temperature", "seed", "stop_token_ids", "ignore_eos",
  "logprobs", ...}, "model"?, "stream"?, "stream_options"?}``; an
  ``X-Request-Id`` header wins over ``request_id``; the answer's id is
  ``generate-tokens-<id>``;
- whole answer: ``{"request_id", "model", "created", "usage", "prompt_logprobs",
  ..., "output_mode": "tokens", "choices": [{"index", "finish_reason",
  "stop_reason", "token_ids", "routed_experts", "sampling_mask",
  "weight_versions": [{"version", "start", "end"}] | null, "logprobs":
  {"content": [{"token_id", "logprob", "rank", "top_logprobs"}]} | null}]}``;
- stream: one event per choice per step with the new ``token_ids`` (deltas),
  ``weight_versions`` on the final chunk only, a usage chunk with
  ``stream_options.include_usage``, then ``data: [DONE]``;
- validation errors: 400 ``{"error": {"message", "type": "Bad Request", "param":
  "body.FIELD", "code": 400}}``; ``/inference/v1/abort_requests {"request_ids"}``
  answers 200 empty (400 without ``request_ids``).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from trioforward.sim.model._api import Generation
from trioforward.sim.model._errors import (
    ApiError,
    error_body,
    invalid_field,
    invalid_json,
    missing_field,
    unknown_model,
)
from trioforward.sim.model._generate import VOCAB_SIZE, Sample, expected_prompt_logprobs
from trioforward.sim.routes._native import Answer, Native, spans

if TYPE_CHECKING:
    from trioforward.sim.engine._engine import SimEngine

__all__ = ["PATH", "ABORT_PATH", "parse", "whole", "chunk", "refused", "abort_requests"]

PATH = "/inference/v1/generate"
ABORT_PATH = "/inference/v1/abort_requests"
_JSON = b"application/json"
_NULLS = {"routed_experts": None, "sampling_mask": None}


def _bad(message: str, param: str | None = None) -> Answer:
    return 400, _JSON, error_body(message, "BadRequestError", 400, param)


#: The model length the token route's default budget runs to on a simulated
#: engine started without ``max_model_len`` (docs/sim.md, "Token routes").
UNSET_MODEL_LEN = 2048


def parse(engine: SimEngine, body: bytes, headers: dict[bytes, bytes]) -> Native | Answer:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        err = invalid_json(body)
        return err.status, _JSON, err.body()
    if not isinstance(data, dict):
        err = invalid_field("", "dictionary", data)
        return err.status, _JSON, err.body()
    ids = data.get("token_ids")
    if ids is None:
        err = missing_field("token_ids", data)
        return err.status, _JSON, err.body()
    if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
        err = invalid_field("token_ids", "list", ids)
        return err.status, _JSON, err.body()
    if any(not 0 <= t < VOCAB_SIZE for t in ids):
        return _bad(f"Token id {max(ids)} is out of vocabulary")
    params = data.get("sampling_params")
    if not isinstance(params, dict):
        err = missing_field("sampling_params", data) if params is None else invalid_field(
            "sampling_params", "dictionary", params
        )
        return err.status, _JSON, err.body()
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 0):
        return _bad_params(params, invalid_field("sampling_params.max_tokens", "integer", max_tokens))
    model = data.get("model") or engine.adapters.base[0]
    if not engine.adapters.serves(model):
        err = unknown_model(model, engine.adapters.base)
        return err.status, _JSON, err.body()
    if engine.max_model_len is not None:
        if len(ids) > engine.max_model_len:
            return _bad(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of "
                f"{engine.max_model_len}. Make sure that `max_model_len` is no smaller than the number "
                "of text tokens."
            )
    # No max_tokens (or null): vLLM 0.32's token route generates up to the model
    # length left by the prompt (``serving.py``: ``get_max_tokens``; recorded in
    # ``tokens_generate_no_max_tokens``), not /v1/completions' default of 16.
    room = (engine.max_model_len or UNSET_MODEL_LEN) - len(ids)
    if max_tokens is None:
        max_tokens = room
    elif engine.max_model_len is not None:
        max_tokens = min(max_tokens, room)
    stop = params.get("stop") or []
    gen = Generation(
        chat=False,
        model=model,
        prompts=[ids],
        n=params.get("n") or 1,
        max_tokens=max_tokens,
        seed=params.get("seed"),
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        stop=tuple([stop] if isinstance(stop, str) else stop),
        logprobs=params.get("logprobs"),
        prompt_logprobs=params.get("prompt_logprobs"),
        stream=bool(data.get("stream")),
    )
    options = data.get("stream_options")
    gen.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    header = headers.get(b"x-request-id")
    rid = header.decode("latin-1") if header else str(data.get("request_id") or uuid.uuid4().hex)
    return Native(gen, rid, [rid] * gen.n, {"created": int(time.time()), "return_token_ids": data.get("return_token_ids")})


def _bad_params(params: dict[str, Any], inner: ApiError) -> Answer:
    """A field of ``sampling_params`` pydantic refuses: vLLM 0.32 reports the
    ``SamplingParams`` instance check first, then the field (recorded answer
    ``tokens_err_max_tokens_type``)."""
    first = {
        "type": "is_instance_of",
        "loc": "body.sampling_params",
        "msg": "Input should be an instance of SamplingParams",
        "input": f"<dict of {len(params)} items>",
        "ctx": {"class": "SamplingParams"},
    }
    detail = inner.message.split("\n  ", 1)[1]
    message = f"2 validation errors:\n  {first!r}\n  {detail}"
    return 400, _JSON, error_body(message, "Bad Request", 400, "body.sampling_params")


def _logprobs(s: Sample, k: int | None, start: int = 0) -> dict[str, Any] | None:
    if k is None:
        return None
    content = []
    for t, lp in zip(s.tokens[start:], s.logprobs[start:], strict=True):
        top = [{"token_id": t, "logprob": lp, "rank": 1}]
        for j in range(1, max(k, 1)):
            top.append({"token_id": (t + 7919 * j) % VOCAB_SIZE, "logprob": lp - 0.125 * j, "rank": j + 1})
        content.append({"token_id": t, "logprob": lp, "rank": 1, "top_logprobs": top})
    return {"content": content}


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _spans(engine: SimEngine, versions: list[str | None], length: int) -> list[dict[str, Any]]:
    """The spans over ``length`` output positions: vLLM's engine core starts at version
    ``"default"`` (``vllm/v1/engine/core.py``), so a span is there without any update."""
    now = engine.rl.weight_version or "default"
    filled = [v or "default" for v in versions[:length]]
    filled += [filled[-1] if filled else now] * (length - len(filled))
    return spans(list(filled), length) or []


def _choice(
    engine: SimEngine, i: int, s: Sample, gen: Generation, versions: list[str | None], start: int, final: bool
) -> dict[str, Any]:
    return {
        "index": i,
        "finish_reason": s.finish_reason or None,
        "stop_reason": s.stop_reason if s.finish_reason == "stop" else None,
        "token_ids": list(s.tokens[start:]),
        **_NULLS,
        "weight_versions": _spans(engine, versions, len(s.tokens)) if final else None,
        "logprobs": _logprobs(s, gen.logprobs, start),
    }


def whole(engine: SimEngine, nat: Native, samples: list[Sample], versions: list[str | None]) -> bytes:
    gen = nat.gen
    prompt = gen.prompts[0]
    prompt_lp = expected_prompt_logprobs(gen.model, prompt, gen.prompt_logprobs) if gen.prompt_logprobs is not None else None
    body = {
        "request_id": f"generate-tokens-{nat.rid}",
        "model": gen.model,
        "created": nat.extra["created"],
        "usage": _usage(len(prompt), sum(len(s.tokens) for s in samples)),
        "prompt_logprobs": prompt_lp,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": prompt if nat.extra["return_token_ids"] else None,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "output_mode": "tokens",
        "choices": [
            {**_choice(engine, i, s, gen, versions, 0, True), "finish_reason": s.finish_reason or "stop"}
            for i, s in enumerate(samples)
        ],
    }
    return orjson.dumps(body)


def chunk(
    engine: SimEngine,
    nat: Native,
    samples: list[Sample],
    sent: list[int],
    versions: list[str | None],
    final: bool,
) -> bytes:
    gen = nat.gen
    out = []
    rid = f"generate-tokens-{nat.rid}"
    for i, s in enumerate(samples):
        if sent[i] < 0 or (len(s.tokens) == sent[i] and not (final and s.finish_reason)):
            continue
        finished = bool(s.finish_reason)
        event = {
            "request_id": rid,
            "usage": None,
            "output_mode": "tokens",
            "choices": [_choice(engine, i, s, gen, versions, sent[i], finished)],
        }
        out.append(b"data: " + orjson.dumps(event) + b"\n\n")
        sent[i] = -1 if finished else len(s.tokens)
    if final:
        if gen.include_usage:
            usage = _usage(len(gen.prompts[0]), sum(len(s.tokens) for s in samples))
            usage.pop("prompt_tokens_details")
            usage.pop("completion_tokens_details")
            tail = {"request_id": rid, "usage": usage, "output_mode": "tokens", "choices": []}
            out.append(b"data: " + orjson.dumps(tail) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def refused(nat: Native, status: int, message: str) -> Answer:
    return status, _JSON, error_body(message, "BadRequestError", status)


def abort_requests(engine: SimEngine, body: bytes) -> Answer:
    """Abort the generations named in ``request_ids`` (the id sent, or the answer's
    ``generate-tokens-<id>``); 200 empty."""
    try:
        data = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        return 400, _JSON, error_body(f"JSON decode error: {exc}", "Bad Request", 400)
    ids = data.get("request_ids") if isinstance(data, dict) else None
    if ids is None:
        return 400, _JSON, error_body("Missing 'request_ids' in request body", "Bad Request", 400)
    wanted = {str(i).removeprefix("generate-tokens-") for i in (ids if isinstance(ids, list) else [ids])}
    engine.rl.abort([r.rid for r in engine.rl.runs.values() if r.rid in wanted])
    return 200, b"", b""
