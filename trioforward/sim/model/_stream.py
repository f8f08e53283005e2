"""vLLM's server-sent-event streams, without I/O: one ``bytes`` per decode step.

Chunk layout as vLLM 0.32 sends it (recorded in ``tests/sim/vllm_0_32_fixtures/``,
held by ``tests/sim/test_vllm_contract.py``):

- completions: every chunk's choice has ``index, text, logprobs, finish_reason,
  stop_reason, prompt_token_ids, token_ids``; ``prompt_token_ids`` is set on a
  choice's first chunk only (with ``return_token_ids``), null after;
- chat: first one role chunk per choice (``delta: {role, content: ""}``, the
  chunk also carries ``prompt_token_ids`` and ``prompt_text``), then content
  chunks ``index, delta, logprobs, finish_reason, token_ids``; a choice's last
  chunk adds ``stop_reason``;
- then the usage chunk (``choices: []``, usage without details, with
  ``stream_options.include_usage``) and ``data: [DONE]``; ``system_fingerprint``
  is on the usage chunk, or without one on each choice's last chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from trioforward.sim.model._api import (
    SYSTEM_FINGERPRINT,
    Generation,
    chat_logprobs,
    completion_logprobs,
    token_text,
    usage,
)
from trioforward.sim.model._generate import Sample

__all__ = ["stream_steps", "STREAM_CONTENT_TYPE"]

STREAM_CONTENT_TYPE = b"text/event-stream; charset=utf-8"


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _prelude(gen: Generation, n: int, head: dict[str, Any]) -> bytes:
    if not gen.chat:
        return b""
    prelude = b""
    for index in range(n):
        delta = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        ids = gen.prompts[0] if gen.return_token_ids and index == 0 else None
        prelude += _event({**head, "choices": [delta], "prompt_token_ids": ids, "prompt_text": None})
    return prelude


def stream_steps(gen: Generation, samples: list[Sample], rid: str, created: int) -> Iterator[bytes]:
    """The SSE body, one ``bytes`` per decode step (every choice's chunk for that token).

    The first step also carries the chat role chunks; the last one ends with the
    usage chunk (``stream_options.include_usage``) and ``data: [DONE]``.
    """
    head = {
        "id": rid,
        "object": "chat.completion.chunk" if gen.chat else "text_completion",
        "created": created,
        "model": gen.echo_model or gen.model,
    }
    steps = max((len(s.tokens) for s in samples), default=0)
    prelude = _prelude(gen, len(samples), head)
    offsets = [0] * len(samples)  # text already sent, per choice
    rendered = [0] * len(samples)  # rendered length of the tokens sent, per choice
    for step in range(max(steps, 1)):
        out = [prelude] if step == 0 else []
        for index, s in enumerate(samples):
            if step >= len(s.tokens) and not (step == 0 and not s.tokens):
                continue
            last = step >= len(s.tokens) - 1
            tok = s.tokens[step : step + 1]
            rendered[index] += sum(1 if s.scripted else len(f" t{t}") for t in tok)
            # Always a prefix of the final text: a stop token or stop string is
            # never sent (vLLM holds back text that may become a stop string).
            text = s.text[offsets[index] : rendered[index]]
            lps = s.logprobs[step : step + 1]
            choice: dict[str, Any] = {"index": index}
            if gen.chat:
                choice["delta"] = {"content": text}
                choice["logprobs"] = (
                    None if gen.logprobs is None else chat_logprobs(tok, lps, gen.logprobs, gen.tokens_as_ids)
                )
                choice["finish_reason"] = s.finish_reason if last else None
                if last:
                    choice["stop_reason"] = s.stop_reason
            else:
                choice["text"] = text
                choice["logprobs"] = (
                    None
                    if gen.logprobs is None
                    else completion_logprobs(
                        Sample(tok, lps, "", None, ""),
                        gen.logprobs,
                        0,
                        # vLLM counts text_offset over the placeholders' lengths
                        # when they replace the tokens (the recorded stream).
                        len("".join(token_text(t, True) for t in s.tokens[:step]))
                        if gen.tokens_as_ids
                        else offsets[index],
                        gen.tokens_as_ids,
                    )
                )
                choice["finish_reason"] = s.finish_reason if last else None
                choice["stop_reason"] = s.stop_reason if last else None
                first_ids = gen.return_token_ids and step == 0
                choice["prompt_token_ids"] = gen.prompts[index // gen.n] if first_ids else None
            offsets[index] += len(text)
            choice["token_ids"] = tok if gen.return_token_ids else None
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if last and not gen.include_usage:  # else the usage chunk carries it
                chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
            out.append(_event(chunk))
        if step == max(steps, 1) - 1:
            if gen.include_usage:
                use = usage(gen, samples, details=False)
                out.append(
                    _event(
                        {**head, "choices": [], "usage": use, "system_fingerprint": SYSTEM_FINGERPRINT}
                    )
                )
            out.append(b"data: [DONE]\n\n")
        yield b"".join(out)
