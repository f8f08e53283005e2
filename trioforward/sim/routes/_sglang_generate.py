"""The simulated SGLang's ``POST /generate`` and ``POST /abort_request`` (docs/sim.md,
"SGLang kind"), as SGLang 0.5.23 answers them (``srt/entrypoints/http_server.py``,
``srt/managers/io_struct.py``, ``srt/managers/tokenizer_manager.py``; the facts
are listed in docs/compatibility.md, "SGLang engines"):

- body: ``input_ids`` (list, or list of lists = batch) or ``text`` (tokenized as
  its UTF-8 bytes, as the OpenAI routes), ``sampling_params`` (only SGLang's keys:
  another, e.g. ``seed``, is 400 ``{"error": "unknown field `seed`, expected one
  of ..."}``; ``max_new_tokens`` default 128 and strictly an integer;
  ``sampling_seed`` seeds), ``rid``, ``stream``, ``return_logprob``,
  ``logprob_start_len`` (-1: output only; 0: the prompt too), ``lora_path``
  (an adapter *name*; one never loaded → 400); unknown top-level keys are ignored;
- answer: one object for one prompt and ``n = 1``, else a list (prompt-major,
  sample-minor), each ``{"text", "output_ids", "meta_info": {"id",
  "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
  "weight_version", "weight_versions", "e2e_latency", "output_token_logprobs"?,
  "input_token_logprobs"?}}``; ``output_ids`` keep the stop token, ``text`` does not;
- ids: a string ``rid`` of a batch becomes ``<rid>_<i>``; ``n > 1`` gives each
  sample a fresh uuid hex; an id already in flight → 400 ``Duplicate request ID
  detected: <rid>``;
- streams are cumulative: each event repeats the whole text, ids and logprob
  lists so far (``index`` in batches); ``data: [DONE]`` ends them; an error found
  after the 200 head is one ``data: {"error": {...}}`` event;
- an abort (``/abort_request {"rid"}`` by prefix, a pause in mode ``abort``)
  answers 200 with ``finish_reason {"type": "abort", "message": "Aborted",
  "status_code": null, "err_type": null}`` and the tokens so far;
  ``/abort_request`` answers 200 with an empty body, known id or not.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import orjson

from trioforward.sim.model._api import Generation
from trioforward.sim.model._generate import VOCAB_SIZE, Sample, expected_prompt_logprobs, tokenize
from trioforward.sim.routes._native import Answer, Native, spans
from trioforward.sim.routes._sglang_info import weight_version

if TYPE_CHECKING:
    from trioforward.sim.engine._engine import SimEngine

__all__ = ["PATH", "parse", "whole", "chunk", "refused", "abort_request", "SAMPLING_KEYS"]

PATH = "/generate"
_JSON = b"application/json"
STREAM_TYPE = b"text/event-stream"
#: sampling_params keys SGLang 0.5.23 accepts (srt/sampling/sampling_params.py).
SAMPLING_KEYS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)  # fmt: skip
_INTS = ("max_new_tokens", "top_k", "min_new_tokens", "n", "sampling_seed", "stream_interval")
_FLOATS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")


def _error(status: int, message: str, stream: bool = False) -> Answer:
    """A tokenizer-side refusal: 400 ``{"error": {"message"}}``, or in a stream (whose
    200 head SGLang sends before these checks run) one error event and ``[DONE]``; a
    status other than 400 (a scheduler abort: 503, 500) has the HTTP-exception shape."""
    if stream:
        event = {"error": {"message": message, "type": "invalid_request_error", "code": status, "retryable": False}}
        return 200, STREAM_TYPE, b"data: " + orjson.dumps(event) + b"\n\ndata: [DONE]\n\n"
    if status != 400:
        return status, _JSON, http_error(status, message)
    return status, _JSON, orjson.dumps({"error": {"message": message}})


def http_error(status: int, message: str) -> bytes:
    """The body of an HTTP exception or a validation failure (http_server.py:579-660)."""
    kind = "Bad Request" if status == 400 else str(status)
    return orjson.dumps({"object": "error", "message": message, "type": kind, "param": None, "code": status})


#: pydantic's lax booleans: what a bool field of GenerateReqInput takes beyond true/false.
_LAX_BOOLS = frozenset({0, 1, "0", "1", "true", "false", "t", "f", "yes", "no", "y", "n", "on", "off"})
#: GenerateReqInput's bool fields the contract gate does not list (checked by pydantic).
_DATACLASS_BOOLS = ("return_routed_experts",)


def _validation(data: dict[str, Any]) -> Answer | None:
    for key in _DATACLASS_BOOLS:
        value = data.get(key)
        if value is None or isinstance(value, bool):
            continue
        lax = isinstance(value, int | str) and (value.lower() if isinstance(value, str) else value) in _LAX_BOOLS
        if not lax:
            detail = {
                "type": "bool_parsing" if isinstance(value, str) else "bool_type",
                "loc": ("body", key),
                "msg": "Input should be a valid boolean",
                "input": value,
            }
            return 400, _JSON, http_error(400, str([detail]))
    return None


def _contract(message: str) -> Answer:
    return 400, _JSON, orjson.dumps({"error": message})


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "a value"


def _params(raw: Any) -> dict[str, Any] | Answer:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        return _contract(f"invalid type: {_type_name(raw)}, expected struct SamplingParams")
    for key, value in raw.items():
        if key not in SAMPLING_KEYS:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            return _contract(f"unknown field `{key}`, expected one of {expected}")
        if value is None:
            continue
        if key in _INTS and (type(value) is not int):
            return _contract(f"invalid type: {_type_name(value)}, expected i64")
        if key in _FLOATS and (isinstance(value, bool) or not isinstance(value, int | float)):
            return _contract(f"invalid type: {_type_name(value)}, expected f64")
        if key == "ignore_eos" and not isinstance(value, bool):
            return _contract(f"invalid type: {_type_name(value)}, expected a boolean")
    return raw


def parse(engine: SimEngine, body: bytes, headers: dict[bytes, bytes]) -> Native | Answer:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return _contract(f"expected value at line 1 column {getattr(exc, 'pos', 0) + 1}")
    if not isinstance(data, dict):
        return _contract("invalid type: expected struct GenerateRequest")
    for key in ("stream", "return_logprob"):
        if key in data and data[key] is not None and not isinstance(data[key], bool):
            return _contract(f"invalid type: {_type_name(data[key])}, expected a boolean")
    params = _params(data.get("sampling_params"))
    if isinstance(params, tuple):
        return params
    invalid = _validation(data)
    if invalid is not None:
        return invalid
    stream = bool(data.get("stream"))
    ids, text = data.get("input_ids"), data.get("text")
    if ids is None and text is None:
        return _error(400, "Either text, input_ids or input_embeds should be provided.", stream)
    if ids is not None:
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts = ids if batch else [ids]
    else:
        batch = isinstance(text, list)
        texts: list[Any] = text if isinstance(text, list) else [text]
        prompts = [tokenize(t) for t in texts]
    refused = _rid_refusal(data.get("rid"), len(prompts) if batch else None)
    if refused is not None:
        return _error(400, refused, stream)
    for p in prompts:
        if not isinstance(p, list) or not all(type(t) is int for t in p):
            return _contract("invalid type: expected a sequence of integers for input_ids")
        if not p:
            return _error(400, "input_ids cannot be empty.", stream)
        if any(not 0 <= t < VOCAB_SIZE for t in p):
            return _error(400, f"Token id out of range: the vocabulary has {VOCAB_SIZE} tokens.", stream)
        if engine.max_model_len is not None and len(p) >= engine.max_model_len:
            return _error(
                400,
                f"The input ({len(p)} tokens) is longer than the model's context length "
                f"({engine.max_model_len} tokens).",
                stream,
            )
    lora = data.get("lora_path")
    model = engine.adapters.base[0]
    if isinstance(lora, str) and lora:
        if not engine.adapters.runtime_lora:
            return _error(400, f"LoRA adapter '{lora}' was requested, but LoRA is not enabled.", stream)
        if lora not in engine.adapters.loaded:
            return _error(400, f"Got LoRA adapter that has never been loaded: {lora}", stream)
        model = lora
    asked = params.get("max_new_tokens")
    longest = max(map(len, prompts))
    if asked is not None and engine.max_model_len is not None and longest + asked > engine.max_model_len:
        return _error(
            400,
            f"Requested token count exceeds the model's maximum context length of {engine.max_model_len} "
            f"tokens. You requested a total of {longest + asked} tokens: {longest} tokens from the input "
            f"messages and {asked} tokens for the completion. Please reduce the number of tokens in the "
            "input messages or the completion to fit within the limit.",
            stream,
        )
    n = params.get("n") or 1
    max_new = params.get("max_new_tokens", 128)
    if max_new is None:
        max_new = 1 << 16
    if engine.max_model_len is not None:
        max_new = min(max_new, engine.max_model_len - max(map(len, prompts)))
    stop = params.get("stop") or []
    gen = Generation(
        chat=False,
        model=model,
        prompts=prompts,
        n=n,
        max_tokens=max_new,
        seed=params.get("sampling_seed"),
        stop_token_ids=() if params.get("ignore_eos") else tuple(params.get("stop_token_ids") or ()),
        stop=tuple([stop] if isinstance(stop, str) else stop),
        logprobs=0 if data.get("return_logprob") else None,
        stream=bool(data.get("stream")),
    )
    rid = data.get("rid")
    if isinstance(rid, list):
        rids = [str(r) for r in rid]
        rid = rids[0] if rids else uuid.uuid4().hex
    else:
        rid = str(rid) if rid is not None else uuid.uuid4().hex
        if n > 1:
            rids = [uuid.uuid4().hex for _ in range(len(prompts) * n)]
        elif batch:
            rids = [f"{rid}_{i}" for i in range(len(prompts))]
        else:
            rids = [rid]
    extra = {
        "batch": batch or n > 1,
        "logprob_start_len": data.get("logprob_start_len", -1),
        "max_new": max_new,
    }
    return Native(gen, rid, rids, extra)


def _finish(s: Sample, nat: Native) -> dict[str, Any] | None:
    if s.finish_reason == "":
        return None
    if s.finish_reason == "abort":
        return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    if s.finish_reason == "stop":
        return {"type": "stop", "matched": s.stop_reason}
    return {"type": "length", "length": nat.extra["max_new"]}


def _item(engine: SimEngine, nat: Native, i: int, s: Sample, versions: list[str | None]) -> dict[str, Any]:
    gen = nat.gen
    prompt = gen.prompts[i // gen.n]
    finished = s.finish_reason != ""
    text = "".join(f" t{t}" for t in s.tokens)
    if s.finish_reason == "stop":
        text = s.text
    meta: dict[str, Any] = {
        "id": nat.rids[i] if i < len(nat.rids) else nat.rid,
        "finish_reason": _finish(s, nat),
        "prompt_tokens": len(prompt),
        "completion_tokens": len(s.tokens),
        "cached_tokens": 0,
        "weight_version": weight_version(engine),
    }
    if finished:
        meta["weight_versions"] = spans(versions, len(s.tokens)) or [
            {"version": weight_version(engine), "start": 0, "end": len(s.tokens)}
        ]
        meta["e2e_latency"] = 0.0
    if gen.logprobs is not None:
        meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(s.tokens, s.logprobs, strict=True)]
        meta["output_token_logprobs_length"] = len(s.tokens)
        if nat.extra["logprob_start_len"] == 0:
            entries = expected_prompt_logprobs(gen.model, prompt)
            meta["input_token_logprobs"] = [
                [None if e is None else e[str(t)]["logprob"], t, None]
                for t, e in zip(prompt, entries, strict=True)
            ]
    return {"text": text, "output_ids": list(s.tokens), "meta_info": meta}


def whole(engine: SimEngine, nat: Native, samples: list[Sample], versions: list[str | None]) -> bytes:
    items = [_item(engine, nat, i, s, versions) for i, s in enumerate(samples)]
    return orjson.dumps(items if nat.extra["batch"] else items[0])


def chunk(
    engine: SimEngine,
    nat: Native,
    samples: list[Sample],
    sent: list[int],
    versions: list[str | None],
    final: bool,
) -> bytes:
    out = []
    for i, s in enumerate(samples):
        if len(s.tokens) == sent[i] and not final:
            continue
        if final and sent[i] == -1:
            continue  # its finished event went out already
        item = _item(engine, nat, i, s, versions)
        if nat.extra["batch"]:
            item["index"] = i
        out.append(b"data: " + orjson.dumps(item) + b"\n\n")
        sent[i] = -1 if s.finish_reason else len(s.tokens)
    if final:
        out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def refused(nat: Native, status: int, message: str) -> Answer:
    return _error(status, message, nat.gen.stream)


def abort_request(engine: SimEngine, body: bytes) -> Answer:
    """``POST /abort_request {"rid", "abort_all"}``: every running generation whose
    id starts with ``rid`` (all with ``abort_all``); 200, empty body."""
    try:
        data = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError:
        data = {}
    data = data if isinstance(data, dict) else {}
    rid = data.get("rid") or ""
    if data.get("abort_all"):
        engine.rl.abort()
    elif isinstance(rid, str) and rid:
        engine.rl.abort([r.rid for r in engine.rl.runs.values() if r.rid.startswith(rid)])
    return 200, b"", b""


def _rid_refusal(rid: Any, batch_size: int | None) -> str | None:
    """What SGLang's ``GenerateReqInput`` normalization refuses in ``rid`` (a 400
    ``ValueError``; ``io_struct.py``, ``_normalize_rid``), or None. ``batch_size``:
    None for a single prompt, whose list ``rid`` SGLang refuses since its fix
    (before, a 500: the list reached a dict as a key)."""
    if rid is None:
        return None
    if isinstance(rid, list) and all(isinstance(r, str) for r in rid):
        if batch_size is None:
            return "The rid should be a string for a single request, got a list."
        if len(rid) != batch_size:
            return "The specified rids length mismatch with the batch_size for batch processing."
        return None
    if isinstance(rid, str):
        return None
    return "The rid should be a string or a list of strings."
