"""Engine response bodies to arrays (docs/design.md, "Layers").

``decode_completion`` parses a vLLM ``/v1/completions`` body (docs/compatibility.md, "vLLM engines") with
orjson and turns the per-token lists into numpy arrays: token ids ``int32``,
logprobs ``float32``. The gateway decodes once; the arrays are what trainers use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

__all__ = [
    "Completion",
    "Choice",
    "decode_completion",
    "prompt_logprobs_array",
    "choices_doc",
    "weight_spans",
    "span_version",
    "UNVERSIONED",
    "CodecError",
]

#: The span version of tokens decoded before any weight version was recorded: the
#: label vLLM 0.32's engine core (``/inference/v1/generate``'s ``weight_versions``)
#: and SGLang (``meta_info.weight_versions``) give the weights they started with,
#: so a span reads the same from the engine and from the gateway
#: (docs/operations.md, "Weight versions").
UNVERSIONED = "default"


def span_version(version: str | None) -> str:
    """The ``version`` of a ``weight_versions`` span: ``version``, or
    :data:`UNVERSIONED` when none was recorded."""
    return UNVERSIONED if version is None else version

_EMPTY_I32: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)


class CodecError(ValueError):
    """The body is not a completion response (not JSON, or missing ``choices``),
    or lacks the ``token_ids`` a caller required (see :func:`decode_completion`)."""


@dataclass(slots=True)
class Choice:
    """One sampled sequence.

    ``tokens``: ``np.ndarray[int32]`` of shape ``(n,)`` (``token_ids`` of the
    response; empty if the engine was not asked for ``return_token_ids``);
    ``logprobs``: ``np.ndarray[float32]`` of shape ``(n,)`` (the sampled tokens'
    logprobs, NaN where the engine gave none) or ``None`` when not requested.
    ``weight_versions``: spans ``[{"version", "start", "end"}]`` over output
    positions (``end`` exclusive) naming the weight version that produced them:
    one span, unless a ``replay="continue"`` pause split the generation
    (docs/operations.md); ``token_versions``: ``np.ndarray[int32]`` ``(n,)``, the
    index in ``weight_versions`` of each token's span.
    """

    index: int
    text: str
    tokens: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float32] | None
    finish_reason: str
    stop_reason: Any = None
    prompt_tokens: npt.NDArray[np.int32] | None = None
    weight_versions: list[dict[str, Any]] = field(default_factory=list)
    token_versions: npt.NDArray[np.int32] = field(default_factory=lambda: _EMPTY_I32)


@dataclass(slots=True)
class Completion:
    """A decoded ``/v1/completions`` response.

    ``prompt_logprobs``: ``np.ndarray[float32]`` of shape ``(len(prompt),)``, NaN at
    position 0 and wherever the engine gave no value; ``None`` when not requested.
    ``engine`` (URL), ``attempts``, ``queue_time`` and ``engine_time`` (seconds) and
    ``request_id`` (the caller's or the gateway's; docs/server.md, "Request ids and
    rollout groups") are filled in by the dispatch client, as are ``staleness``
    (versions the weights that ended it are behind the current ones, ``None``
    before any version) and ``admission_time`` (seconds at a staleness bound;
    docs/operations.md, "Staleness-bounded admission").
    """

    id: str
    model: str
    choices: list[Choice]
    usage: dict[str, Any]
    prompt_logprobs: npt.NDArray[np.float32] | None = None
    engine: str = ""
    attempts: int = 0
    queue_time: float = 0.0
    engine_time: float = 0.0
    request_id: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    staleness: int | None = None
    admission_time: float = 0.0


def _floats(values: list[Any]) -> npt.NDArray[np.float32]:
    try:
        return np.array(values, dtype=np.float32)
    except (TypeError, ValueError):
        # None entries (vLLM gives null for an undefined logprob) become NaN.
        return np.array([np.nan if v is None else v for v in values], dtype=np.float32)


def _prompt_logprobs(entries: list[Any], prompt: list[int] | None) -> npt.NDArray[np.float32]:
    """vLLM's per-position ``{token_id: {"logprob", "rank", ...}}`` to the prompt tokens' logprobs."""
    out = np.full(len(entries), np.nan, dtype=np.float32)
    for i, entry in enumerate(entries):
        if not entry:
            continue
        item = None
        if prompt is not None and i < len(prompt):
            item = entry.get(str(prompt[i]))
        if item is None and len(entry) == 1:
            item = next(iter(entry.values()))
        if isinstance(item, dict):
            lp = item.get("logprob")
            if lp is not None:
                out[i] = lp
        elif isinstance(item, (int, float)):
            out[i] = item
    return out


def _spans(raw: Any, length: int, version: str | None) -> tuple[list[dict[str, Any]], npt.NDArray[np.int32]]:
    """A choice's ``weight_versions`` (one span under ``version`` when it has none)
    and the per-token span index."""
    spans = raw if isinstance(raw, list) and raw else [{"version": span_version(version), "start": 0, "end": length}]
    out = np.zeros(length, dtype=np.int32)
    for i, span in enumerate(spans):
        out[int(span.get("start", 0)) : int(span.get("end", length))] = i
    return spans, out


def weight_spans(
    raw: Any, length: int, version: str | None
) -> tuple[list[dict[str, Any]], npt.NDArray[np.int32]]:
    """A choice's ``weight_versions`` from the engine's spans ``raw`` (one span under
    ``version`` when it gave none) and each token's span index (``int32`` ``(length,)``)."""
    return _spans(raw, length, version)


def prompt_logprobs_array(entries: list[Any], prompt: list[int] | None) -> npt.NDArray[np.float32]:
    """vLLM's ``prompt_logprobs`` list (``null``, then ``{token_id: {"logprob", ...}}``
    per position) as ``float32`` ``(len(entries),)``, NaN where there is none."""
    return _prompt_logprobs(entries, prompt)


def choices_doc(body: bytes, what: str) -> dict[str, Any]:
    """``body`` parsed: a JSON object with a ``choices`` list. Raises
    :class:`CodecError` naming ``what`` (the body's kind) otherwise."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"{what} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        raise CodecError(f"{what} has no 'choices' list")
    return doc


def decode_completion(
    body: bytes, *, require_token_ids: bool = False, weight_version: str | None = None
) -> Completion:
    """Decode a ``/v1/completions`` response body. Raises :class:`CodecError`.

    ``require_token_ids``: the request asked for ``return_token_ids``, so a choice
    without ``token_ids`` (absent or null; vLLM answers a list, empty for an empty
    sequence) is an error, not an empty sequence: an engine that ignores the option
    would otherwise hand a trainer samples with no tokens. ``weight_version``: the
    version of a choice that carries no ``weight_versions`` spans (its one span)."""
    doc = choices_doc(body, "completion body")
    choices: list[Choice] = []
    prompt_lp: npt.NDArray[np.float32] | None = None
    for raw in doc["choices"]:
        token_ids = raw.get("token_ids")
        if token_ids is None and require_token_ids:
            raise CodecError(
                "the engine answered without 'token_ids' although 'return_token_ids' was"
                " asked: it does not support that option (docs/compatibility.md)"
            )
        tokens = np.array(token_ids, dtype=np.int32) if token_ids else _EMPTY_I32
        lp_block = raw.get("logprobs")
        logprobs = None
        if isinstance(lp_block, dict) and lp_block.get("token_logprobs") is not None:
            logprobs = _floats(lp_block["token_logprobs"])
        prompt_ids = raw.get("prompt_token_ids")
        prompt_tokens = np.array(prompt_ids, dtype=np.int32) if prompt_ids is not None else None
        if prompt_lp is None and raw.get("prompt_logprobs") is not None:
            prompt_lp = _prompt_logprobs(raw["prompt_logprobs"], prompt_ids)
        spans, token_versions = _spans(raw.get("weight_versions"), len(tokens), weight_version)
        choices.append(
            Choice(
                index=int(raw.get("index", len(choices))),
                text=raw.get("text") or "",
                tokens=tokens,
                logprobs=logprobs,
                finish_reason=raw.get("finish_reason") or "",
                stop_reason=raw.get("stop_reason"),
                prompt_tokens=prompt_tokens,
                weight_versions=spans,
                token_versions=token_versions,
            )
        )
    if prompt_lp is None and doc.get("prompt_logprobs") is not None:
        first = doc["choices"][0].get("prompt_token_ids") if doc["choices"] else None
        prompt_lp = _prompt_logprobs(doc["prompt_logprobs"], first)
    return Completion(
        id=str(doc.get("id", "")),
        model=str(doc.get("model", "")),
        choices=choices,
        usage=doc.get("usage") or {},
        prompt_logprobs=prompt_lp,
        raw=doc,
    )
