"""The ``/v1/chat/completions`` shape as continuation reads and writes it (docs/operations.md,
"Which routes continue").

A chat answer an abort pause ended goes on as token completions
(``POST /v1/completions`` with prompt ids + tokens so far): this module is the
only place that knows how a chat body becomes that completion body
(:func:`tokens_body`), how a chat choice or stream chunk reads as a completion
choice (:func:`completion_choice`) and how completion logprobs are written back
as chat entries (:func:`chat_entries`, :func:`chat_event`). Field names are
vLLM 0.32's (``vllm/entrypoints/openai/chat_completion/protocol.py``): a
stream's first chunk carries the templated prompt's ``prompt_token_ids`` at
the top level, each chunk's choice ``delta``, ``logprobs.content`` entries
(``token``, ``logprob``, ``bytes``, ``top_logprobs``) and ``token_ids``.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = [
    "WHOLE_FIELDS",
    "budget_of",
    "top_k",
    "tokens_body",
    "chat_entries",
    "completion_choice",
    "chat_event",
]

# Chat body fields a token completion takes as they are (vLLM's sampling fields).
_KEPT = (
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "logit_bias", "bad_words",
    "allowed_token_ids", "include_stop_str_in_output", "user", "priority",
)  # fmt: skip
#: Chat features the engine applies to the whole message: not continued.
WHOLE_FIELDS = (
    "tools", "functions", "response_format", "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar",
)  # fmt: skip


def budget_of(body: dict[str, Any]) -> int | None:
    """The chat request's token budget (``max_completion_tokens``, else ``max_tokens``),
    ``None`` without one (vLLM gives chat what the model length leaves, which a
    completion continuation cannot know) or with a feature of :data:`WHOLE_FIELDS`."""
    if any(body.get(k) for k in WHOLE_FIELDS):
        return None
    budget = body.get("max_completion_tokens", body.get("max_tokens"))
    return budget if type(budget) is int else None


def top_k(body: dict[str, Any]) -> int:
    """How many ``top_logprobs`` each chat entry carries."""
    top = body.get("top_logprobs")
    return top if type(top) is int else 0


def tokens_body(body: dict[str, Any]) -> dict[str, Any]:
    """The ``/v1/completions`` fields continuing chat ``body``: its sampling fields,
    and ``logprobs: top_logprobs`` (at least 1) when it asked for logprobs."""
    out = {key: body[key] for key in _KEPT if key in body}
    if body.get("logprobs"):
        out["logprobs"] = max(top_k(body), 1)
    return out


def chat_entries(block: dict[str, list[Any]] | None, k: int) -> list[dict[str, Any]]:
    """A completion segment's logprobs as chat ``logprobs.content`` entries (``k``
    top logprobs each)."""
    if block is None:
        return []
    out = []
    for token, lp, top in zip(
        block["tokens"], block["token_logprobs"], block["top_logprobs"], strict=False
    ):
        tops = list((top or {}).items())[:k]
        out.append(
            {
                "token": token,
                "logprob": lp,
                "bytes": list(str(token).encode()),
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in tops
                ],
            }
        )
    return out


def completion_choice(choice: dict[str, Any]) -> dict[str, Any] | None:
    """A chat stream chunk's choice read as a completion choice (``text``,
    ``token_ids``, ``logprobs`` in the completion shape, ``finish_reason``,
    ``stop_reason``); a chunk that adds no text and names no ids adds none (the
    role chunk); ``None`` for a delta a continuation cannot rebuild (tool calls,
    reasoning)."""
    delta = choice.get("delta") or {}
    if delta.get("tool_calls") or delta.get("reasoning") or delta.get("reasoning_content"):
        return None
    text = delta.get("content") or ""
    ids = choice.get("token_ids")
    out: dict[str, Any] = {
        "text": text,
        "token_ids": [] if ids is None and not text else ids,
        "finish_reason": choice.get("finish_reason"),
        "stop_reason": choice.get("stop_reason"),
    }
    block = choice.get("logprobs")
    if isinstance(block, dict):
        entries = block.get("content") or []
        out["logprobs"] = {
            "tokens": [e.get("token") for e in entries],
            "token_logprobs": [e.get("logprob") for e in entries],
            "top_logprobs": [
                {t.get("token"): t.get("logprob") for t in e.get("top_logprobs") or []}
                for e in entries
            ],
            "text_offset": [],
        }
    return out


def chat_event(head: dict[str, Any], out: dict[str, Any], index: int, k: int) -> bytes:
    """One chat stream chunk (SSE event) for completion-shaped choice ``out``
    (:meth:`~trioforward.dispatch.rollout._continue.Generation.tail`)."""
    choice: dict[str, Any] = {
        "index": index,
        "delta": {"content": out["text"]},
        "logprobs": None
        if out.get("logprobs") is None
        else {"content": chat_entries(out["logprobs"], k)},
        "finish_reason": out["finish_reason"],
        "stop_reason": out["stop_reason"],
        "token_ids": out["token_ids"],
    }
    if "weight_versions" in out:
        choice["weight_versions"] = out["weight_versions"]
    return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"
