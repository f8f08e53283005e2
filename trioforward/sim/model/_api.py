"""vLLM's OpenAI-compatible wire format, without I/O: parse requests, build bodies.

Shapes follow vLLM 0.32's ``vllm/entrypoints/openai/protocol.py`` (completion
and chat completion responses); ``tests/sim/test_vllm_contract.py`` holds them
to answers recorded from a real vLLM (docs/compatibility.md). Streams are built
in ``_stream.py``, errors in ``_errors.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from trioforward.sim.model._errors import (
    ApiError,
    error_body,
    invalid_field,
    invalid_json,
    missing_field,
    out_of_range,
)
from trioforward.sim.model._generate import (
    VOCAB_SIZE,
    Sample,
    expected_prompt_logprobs,
    expected_top_logprobs,
    sample,
    scripted_sample,
    tokenize,
)

__all__ = [
    "ApiError",
    "Generation",
    "SYSTEM_FINGERPRINT",
    "parse_generation",
    "render_messages",
    "complete_body",
    "completion_logprobs",
    "chat_logprobs",
    "usage",
    "error_body",
]

_MAX_TOKENS_LIMIT = 1 << 16
_MAX_N = 1024
_MAX_LOGPROBS = 20  # vLLM's default max_logprobs
# vLLM answers "vllm-VERSION-HASH"; the sim names itself.
SYSTEM_FINGERPRINT = "trioforward-sim"


@dataclass(slots=True)
class Generation:
    """A parsed ``/v1/completions`` or ``/v1/chat/completions`` request.

    ``prompts``: one token-id list per prompt (chat: one, the rendered messages);
    choices are numbered prompt-major: ``index = prompt_no * n + i``.
    ``logprobs``: top-k for generated tokens (chat: ``top_logprobs`` when
    ``logprobs`` is true), None = no logprobs. ``max_tokens`` is already cut
    to what fits in the model length (vLLM does not refuse prompt + max_tokens
    over ``max_model_len``; the output ends there with ``finish_reason: "length"``).
    ``cached_tokens``: prompt tokens the engine's prefix cache held (set by an
    engine with one; None = no cache).
    """

    chat: bool
    model: str
    prompts: list[list[int]]
    n: int = 1
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_token_ids: bool = False
    # vLLM's return_tokens_as_token_ids: logprob tokens as "token_id:<id>" (token_text)
    tokens_as_ids: bool = False
    stream: bool = False
    include_usage: bool = False
    #: The name the answer's ``model`` echoes when it is not ``model`` (SGLang's
    #: ``<base>:<adapter>``, sim/routes/_sglang_openai.py).
    echo_model: str | None = None
    cached_tokens: int | None = None
    #: A scripted reply for choice 0 (docs/sim.md, "Scripted replies"), else None.
    script: str | None = None

    def samples(self) -> list[Sample]:
        """Every choice's :class:`Sample`, in choice-index order."""
        out = [
            sample(self.model, p, self.seed, i, self.max_tokens, self.stop_token_ids, self.stop)
            for p in self.prompts
            for i in range(self.n)
        ]
        if self.script is not None:
            out[0] = scripted_sample(
                self.model, self.prompts[0], self.seed, self.script, self.max_tokens
            )
        return out


def _int(body: dict[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid_field(key, "integer", value)
    if key.endswith("logprobs") and value > hi:
        kind = "prompt" if key == "prompt_logprobs" else "sample"
        message = f"Requested {kind} logprobs of {value}, which is greater than max allowed: {hi}"
        raise out_of_range(key, message, value)
    if not lo <= value <= hi:
        raise out_of_range(key, f"{key} must be in [{lo}, {hi}], got {value}.", value)
    return value


def _token_ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(t) is int for t in value):
        return value
    return None


_NO_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"


def _prompts(raw: Any) -> list[list[int]]:
    if raw is None or raw == "" or raw == []:
        raise ApiError(400, _NO_PROMPT, param="prompt")
    if isinstance(raw, str):
        return [tokenize(raw)]
    ids = _token_ids(raw)
    if ids is not None:
        return [ids]
    if isinstance(raw, list):
        out = []
        for item in raw:
            if isinstance(item, str):
                out.append(tokenize(item))
            elif (ids := _token_ids(item)) is not None and ids:
                out.append(ids)
            else:
                raise invalid_field("prompt", "string", raw)
        return out
    raise invalid_field("prompt", "string", raw)


def _messages(body: dict[str, Any]) -> list[int]:
    return render_messages(body.get("messages"), body)


def render_messages(raw: Any, body: dict[str, Any]) -> list[int]:
    """The sim's chat template: one ``"role: content\\n"`` line per message, as UTF-8
    byte ids (what the chat route and ``/tokenize`` prompt with); raises :class:`ApiError`."""
    if raw is None:
        raise missing_field("messages", body)
    if not isinstance(raw, list) or not raw or not all(isinstance(m, dict) for m in raw):
        raise invalid_field("messages", "list", raw)
    parts = []
    for i, m in enumerate(raw):
        content = m.get("content") or ""
        if not isinstance(content, str | list):  # vLLM: a validation error
            raise invalid_field(f"messages.{i}.content", "string", content)
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{m.get('role', 'user')}: {content}\n")
    return tokenize("".join(parts))


def _check_prompt(ids: list[int], max_model_len: int | None) -> None:
    for t in ids:
        if not 0 <= t < VOCAB_SIZE:
            raise ApiError(400, f"Token id {t} is out of vocabulary")
    if max_model_len is not None and len(ids) > max_model_len:
        message = (
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {len(ids)} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt."
        )
        raise out_of_range("input_tokens", message, len(ids))


def _temperature(body: dict[str, Any]) -> None:
    value = body.get("temperature")
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise invalid_field("temperature", "number", value)
    if value < 0:
        message = f"temperature must be non-negative, got {float(value)}."
        raise out_of_range("temperature", message, float(value))


def parse_generation(
    chat: bool, data: bytes, default_model: str, max_model_len: int | None = None
) -> Generation:
    """Parse a generation request body; raises :class:`ApiError` (400) when invalid.

    ``max_model_len``: the model length in tokens (None = unlimited): a longer
    prompt is refused, a longer prompt + ``max_tokens`` is cut (as vLLM).
    """
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise invalid_json(data) from None
    if not isinstance(body, dict):
        raise invalid_field("", "dictionary", body)
    model = body.get("model") or default_model
    if not isinstance(model, str):
        raise invalid_field("model", "string", model)
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _int(body, key, 16, 0, _MAX_TOKENS_LIMIT) or 0
    gen = Generation(chat=chat, model=model, prompts=[], max_tokens=max_tokens)
    gen.n = _int(body, "n", 1, 1, _MAX_N) or 1
    _temperature(body)
    seed = body.get("seed")
    if seed is not None and (type(seed) is not int):
        raise invalid_field("seed", "integer", seed)
    gen.seed = seed
    stop_ids = body.get("stop_token_ids") or []
    if _token_ids(stop_ids) is None:
        raise invalid_field("stop_token_ids", "list", stop_ids)
    gen.stop_token_ids = tuple(stop_ids)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid_field("stop", "string", stop)
    gen.stop = tuple(stop)
    if chat:
        if body.get("logprobs"):
            gen.logprobs = _int(body, "top_logprobs", 0, 0, _MAX_LOGPROBS)
    else:
        if isinstance(body.get("logprobs"), bool):
            # vLLM 0.32 reads a boolean as the int pydantic coerces it to: true is
            # 1, false is 0 (the sampled token's logprob); recorded in
            # completion_logprobs_true / _false.
            body = {**body, "logprobs": int(body["logprobs"])}
        gen.logprobs = _int(body, "logprobs", None, 0, _MAX_LOGPROBS)
    gen.prompt_logprobs = _int(body, "prompt_logprobs", None, 0, _MAX_LOGPROBS)
    gen.return_token_ids = bool(body.get("return_token_ids", False))
    gen.tokens_as_ids = bool(body.get("return_tokens_as_token_ids", False))
    gen.stream = bool(body.get("stream", False))
    options = body.get("stream_options")
    gen.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    gen.prompts = [_messages(body)] if chat else _prompts(body.get("prompt"))
    for ids in gen.prompts:
        _check_prompt(ids, max_model_len)
    if max_model_len is not None:
        gen.max_tokens = min(gen.max_tokens, max_model_len - max(map(len, gen.prompts)))
    return gen


def token_text(token: int, as_ids: bool = False) -> str:
    """A token as vLLM's logprobs name it: its text (``" t<id>"``), or with
    ``return_tokens_as_token_ids`` the placeholder ``"token_id:<id>"`` (vLLM 0.32
    ``entrypoints/generate/base/serving.py``, ``format_token_id_placeholder``)."""
    return f"token_id:{token}" if as_ids else f" t{token}"


def _top(token: int, logprob: float, k: int, as_ids: bool) -> dict[str, float]:
    top = expected_top_logprobs(token, logprob, k)
    if not as_ids:
        return top
    return {f"token_id:{key[2:]}": value for key, value in top.items()}


def completion_logprobs(
    s: Sample, k: int, start: int = 0, offset: int = 0, as_ids: bool = False
) -> dict[str, Any]:
    """A completion choice's ``logprobs`` object for tokens ``start:`` of ``s``, top-``k``.

    ``text_offset`` counts from ``offset`` by the length of each token string (the
    placeholders' with ``as_ids``, as vLLM 0.32 ``_create_completion_logprobs``);
    ``top_logprobs`` maps token strings to logprobs.
    """
    texts = [token_text(t, as_ids) for t in s.tokens[start:]]
    offsets = []
    for t in texts:
        offsets.append(offset)
        offset += len(t)
    return {
        "text_offset": offsets,
        "token_logprobs": s.logprobs[start:],
        "tokens": texts,
        "top_logprobs": [
            _top(t, lp, k, as_ids) for t, lp in zip(s.tokens[start:], s.logprobs[start:], strict=True)
        ],
    }


def chat_logprobs(
    tokens: Sequence[int], logprobs: Sequence[float], k: int, as_ids: bool = False
) -> dict[str, Any]:
    """A chat choice's ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}]}``.

    With ``as_ids`` every ``token`` is ``"token_id:<id>"``; a content entry's
    ``bytes`` stay the decoded text's, a top entry's are the placeholder's (vLLM
    0.32 ``_create_chat_logprobs`` / ``_get_top_logprobs``)."""
    content = []
    for t, lp in zip(tokens, logprobs, strict=True):
        text = f" t{t}"
        top = [
            {"token": tt, "logprob": tl, "bytes": list(tt.encode())}
            for tt, tl in list(_top(t, lp, k, as_ids).items())[:k]
        ]
        content.append(
            {"token": token_text(t, as_ids), "logprob": lp, "bytes": list(text.encode()), "top_logprobs": top}
        )
    return {"content": content}


def usage(gen: Generation, samples: list[Sample], details: bool = True) -> dict[str, Any]:
    """The ``usage`` object; ``details=False`` for a stream's usage chunk (vLLM sends no details there).

    ``prompt_tokens_details`` is null as vLLM without ``--enable-prompt-tokens-details``,
    except with a nonzero prefix-cache hit (``gen.cached_tokens``).
    """
    prompt = sum(len(p) for p in gen.prompts)  # once per prompt, not per choice (as vLLM)
    completion = sum(len(s.tokens) for s in samples)
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details:
        out["prompt_tokens_details"] = None
        out["completion_tokens_details"] = None
    if gen.cached_tokens:
        # vLLM with --enable-prompt-tokens-details sets this only for a nonzero
        # count (vllm/entrypoints/openai/serving_completion.py, serving_chat.py).
        out["prompt_tokens_details"] = {"cached_tokens": gen.cached_tokens}
    return out


def _message(text: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }


def complete_body(gen: Generation, samples: list[Sample], rid: str, created: int) -> bytes:
    """The non-streaming response body (``text_completion`` or ``chat.completion``).

    Every field vLLM 0.32 sends is present (null when unused), in vLLM's order.
    """
    prompt_lps = (
        [expected_prompt_logprobs(gen.model, p, gen.prompt_logprobs) for p in gen.prompts]
        if gen.prompt_logprobs is not None
        else None
    )
    ids = gen.return_token_ids
    choices: list[dict[str, Any]] = []
    for index, s in enumerate(samples):
        p = index // gen.n
        if gen.chat:
            lps = None if gen.logprobs is None else chat_logprobs(s.tokens, s.logprobs, gen.logprobs, gen.tokens_as_ids)
            choice: dict[str, Any] = {"index": index, "message": _message(s.text), "logprobs": lps}
        else:
            lps = None if gen.logprobs is None else completion_logprobs(s, gen.logprobs, as_ids=gen.tokens_as_ids)
            choice = {"index": index, "text": s.text, "logprobs": lps}
        choice["finish_reason"] = s.finish_reason
        choice["stop_reason"] = s.stop_reason
        choice["token_ids"] = s.tokens if ids else None
        if not gen.chat:
            choice["prompt_logprobs"] = None if prompt_lps is None else prompt_lps[p]
            choice["prompt_token_ids"] = gen.prompts[p] if ids else None
        choice["routed_experts"] = None
        choices.append(choice)
    out: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion" if gen.chat else "text_completion",
        "created": created,
        "model": gen.echo_model or gen.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage(gen, samples),
    }
    if gen.chat:
        out["prompt_logprobs"] = None if prompt_lps is None else prompt_lps[0]
        out["prompt_token_ids"] = gen.prompts[0] if ids else None
        out["prompt_text"] = None
    out["kv_transfer_params"] = out["ec_transfer_params"] = out["metrics"] = None
    return orjson.dumps(out)
