"""vLLM's OpenAI-compatible wire format, without I/O: parse requests, build bodies.

Shapes follow vLLM's ``vllm/entrypoints/openai/protocol.py`` (completion and
chat completion responses and stream chunks) as summarised in
``shared/reference/engine_api.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from trioforward.sim._generate import (
    Sample,
    expected_prompt_logprobs,
    expected_top_logprobs,
    sample,
    tokenize,
)

__all__ = [
    "ApiError",
    "Generation",
    "parse_generation",
    "complete_body",
    "stream_steps",
    "error_body",
]

_MAX_TOKENS_LIMIT = 1 << 16
_MAX_N = 1024


class ApiError(Exception):
    """A request the engine answers with ``status`` and an OpenAI error body."""

    def __init__(self, status: int, message: str, type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.status)


def error_body(message: str, type: str, code: int) -> bytes:
    """``{"error": {"message", "type", "code"}}`` as vLLM answers errors."""
    return orjson.dumps({"error": {"message": message, "type": type, "code": code}})


@dataclass(slots=True)
class Generation:
    """A parsed ``/v1/completions`` or ``/v1/chat/completions`` request.

    ``prompts``: one token-id list per prompt (chat: one, the rendered messages);
    choices are numbered prompt-major: ``index = prompt_no * n + i``.
    ``logprobs``: top-k for generated tokens (chat: ``top_logprobs`` when
    ``logprobs`` is true), None = no logprobs. ``cached_tokens``: prompt tokens
    the engine's prefix cache held (set by an engine with one; None = no cache).
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
    stream: bool = False
    include_usage: bool = False
    cached_tokens: int | None = None

    def samples(self) -> list[Sample]:
        """Every choice's :class:`Sample`, in choice-index order."""
        return [
            sample(self.model, p, self.seed, i, self.max_tokens, self.stop_token_ids, self.stop)
            for p in self.prompts
            for i in range(self.n)
        ]


def _int(body: dict[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ApiError(400, f"{key} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _token_ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(t) is int and 0 <= t < 1 << 31 for t in value):
        return value
    return None


def _prompts(raw: Any) -> list[list[int]]:
    if isinstance(raw, str):
        return [tokenize(raw)]
    ids = _token_ids(raw)
    if ids is not None and (raw or not isinstance(raw, list)):
        return [ids]
    if isinstance(raw, list) and raw:
        out = []
        for item in raw:
            if isinstance(item, str):
                out.append(tokenize(item))
            elif (ids := _token_ids(item)) is not None:
                out.append(ids)
            else:
                raise ApiError(
                    400, "prompt must be a string, a list of token ids, or a list of either"
                )
        return out
    raise ApiError(400, "prompt must be a string, a list of token ids, or a list of either")


def _messages(raw: Any) -> list[int]:
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages must be a non-empty list")
    parts = []
    for m in raw:
        if not isinstance(m, dict):
            raise ApiError(400, "each message must be an object")
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{m.get('role', 'user')}: {content}\n")
    return tokenize("".join(parts))


def parse_generation(chat: bool, data: bytes, default_model: str) -> Generation:
    """Parse a generation request body; raises :class:`ApiError` (400) when invalid."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "body must be a JSON object")
    model = body.get("model") or default_model
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string")
    prompts = [_messages(body.get("messages"))] if chat else _prompts(body.get("prompt"))
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    gen = Generation(chat=chat, model=model, prompts=prompts)
    gen.max_tokens = _int(body, key, 16, 0, _MAX_TOKENS_LIMIT) or 0
    gen.n = _int(body, "n", 1, 1, _MAX_N) or 1
    seed = body.get("seed")
    if seed is not None and (type(seed) is not int):
        raise ApiError(400, "seed must be an integer")
    gen.seed = seed
    stop_ids = body.get("stop_token_ids") or []
    if _token_ids(stop_ids) is None:
        raise ApiError(400, "stop_token_ids must be a list of token ids")
    gen.stop_token_ids = tuple(stop_ids)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "stop must be a string or a list of strings")
    gen.stop = tuple(stop)
    if chat:
        if body.get("logprobs"):
            gen.logprobs = _int(body, "top_logprobs", 0, 0, 20)
    else:
        gen.logprobs = _int(body, "logprobs", None, 0, 20)
    gen.prompt_logprobs = _int(body, "prompt_logprobs", None, 0, 20)
    gen.return_token_ids = bool(body.get("return_token_ids", False))
    gen.stream = bool(body.get("stream", False))
    options = body.get("stream_options")
    gen.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return gen


def _completion_logprobs(s: Sample, k: int, start: int = 0, offset: int = 0) -> dict[str, Any]:
    texts = [f" t{t}" for t in s.tokens[start:]]
    offsets = []
    for t in texts:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": texts,
        "token_logprobs": s.logprobs[start:],
        "top_logprobs": [
            expected_top_logprobs(t, lp, k)
            for t, lp in zip(s.tokens[start:], s.logprobs[start:], strict=True)
        ],
        "text_offset": offsets,
    }


def _chat_logprobs(tokens: Sequence[int], logprobs: Sequence[float], k: int) -> dict[str, Any]:
    content = []
    for t, lp in zip(tokens, logprobs, strict=True):
        text = f" t{t}"
        top = [
            {"token": tt, "logprob": tl, "bytes": list(tt.encode())}
            for tt, tl in list(expected_top_logprobs(t, lp, k).items())[:k]
        ]
        content.append(
            {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": top}
        )
    return {"content": content}


def _usage(gen: Generation, samples: list[Sample]) -> dict[str, Any]:
    prompt = sum(len(p) for p in gen.prompts)  # once per prompt, not per choice (as vLLM)
    completion = sum(len(s.tokens) for s in samples)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if gen.cached_tokens:
        # vLLM with --enable-prompt-tokens-details sets this only for a nonzero
        # count (vllm/entrypoints/openai/serving_completion.py, serving_chat.py).
        usage["prompt_tokens_details"] = {"cached_tokens": gen.cached_tokens}
    return usage


def complete_body(gen: Generation, samples: list[Sample], rid: str, created: int) -> bytes:
    """The non-streaming response body (``text_completion`` or ``chat.completion``)."""
    prompt_lps = (
        [expected_prompt_logprobs(gen.model, p, gen.prompt_logprobs) for p in gen.prompts]
        if gen.prompt_logprobs is not None
        else None
    )
    choices: list[dict[str, Any]] = []
    for index, s in enumerate(samples):
        p = index // gen.n
        if gen.chat:
            choice: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": s.text},
                "logprobs": None
                if gen.logprobs is None
                else _chat_logprobs(s.tokens, s.logprobs, gen.logprobs),
                "finish_reason": s.finish_reason,
                "stop_reason": s.stop_reason,
            }
        else:
            choice = {
                "index": index,
                "text": s.text,
                "logprobs": None if gen.logprobs is None else _completion_logprobs(s, gen.logprobs),
                "finish_reason": s.finish_reason,
                "stop_reason": s.stop_reason,
                "prompt_logprobs": None if prompt_lps is None else prompt_lps[p],
            }
            if gen.return_token_ids:
                choice["prompt_token_ids"] = gen.prompts[p]
        if gen.return_token_ids:
            choice["token_ids"] = s.tokens
        choices.append(choice)
    out: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion" if gen.chat else "text_completion",
        "created": created,
        "model": gen.model,
        "choices": choices,
        "usage": _usage(gen, samples),
    }
    if gen.chat:
        out["prompt_logprobs"] = None if prompt_lps is None else prompt_lps[0]
        if gen.return_token_ids:
            out["prompt_token_ids"] = gen.prompts[0]
    return orjson.dumps(out)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def stream_steps(gen: Generation, samples: list[Sample], rid: str, created: int) -> Iterator[bytes]:
    """The SSE body, one ``bytes`` per decode step (every choice's chunk for that token).

    The first step also carries the chat role deltas (and, with
    ``return_token_ids``, ``prompt_token_ids``); the last one ends with the
    usage chunk (``stream_options.include_usage``) and ``data: [DONE]``.
    A choice's last chunk carries its ``finish_reason``.
    """
    head = {
        "id": rid,
        "object": "chat.completion.chunk" if gen.chat else "text_completion",
        "created": created,
        "model": gen.model,
    }
    steps = max((len(s.tokens) for s in samples), default=0)
    prelude = b""
    if gen.chat:
        for index in range(len(samples)):
            delta = {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            extra = (
                {"prompt_token_ids": gen.prompts[0]} if gen.return_token_ids and index == 0 else {}
            )
            prelude += _event({**head, "choices": [delta], **extra})
    offsets = [0] * len(samples)  # text already sent, per choice
    rendered = [0] * len(samples)  # rendered length of the tokens sent, per choice
    for step in range(max(steps, 1)):
        out = [prelude] if step == 0 else []
        for index, s in enumerate(samples):
            if step >= len(s.tokens) and not (step == 0 and not s.tokens):
                continue
            last = step >= len(s.tokens) - 1
            tok = s.tokens[step : step + 1]
            rendered[index] += sum(len(f" t{t}") for t in tok)
            # Always a prefix of the final text: a stop token or stop string is
            # never sent (vLLM holds back text that may become a stop string).
            text = s.text[offsets[index] : rendered[index]]
            choice: dict[str, Any] = {"index": index}
            if gen.chat:
                choice["delta"] = {"content": text}
                choice["logprobs"] = (
                    None
                    if gen.logprobs is None
                    else _chat_logprobs(tok, s.logprobs[step : step + 1], gen.logprobs)
                )
            else:
                choice["text"] = text
                choice["logprobs"] = (
                    None
                    if gen.logprobs is None
                    else _completion_logprobs(
                        Sample(tok, s.logprobs[step : step + 1], "", None, ""),
                        gen.logprobs,
                        0,
                        offsets[index],
                    )
                )
            offsets[index] += len(text)
            choice["finish_reason"] = s.finish_reason if last else None
            choice["stop_reason"] = s.stop_reason if last else None
            if gen.return_token_ids:
                choice["token_ids"] = tok
                if step == 0 and not gen.chat:
                    choice["prompt_token_ids"] = gen.prompts[index // gen.n]
            out.append(_event({**head, "choices": [choice]}))
        if step == max(steps, 1) - 1:
            if gen.include_usage:
                out.append(_event({**head, "choices": [], "usage": _usage(gen, samples)}))
            out.append(b"data: [DONE]\n\n")
        yield b"".join(out)
