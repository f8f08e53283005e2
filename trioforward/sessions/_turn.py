"""One chat turn of a session: the token prompt, the engine call, the chat answer
(docs/sessions.md, "How a turn is built").

The engine gets the turn as a token completion — ``POST /v1/completions`` with
``prompt`` = the prompt ids (:mod:`._history`), ``return_token_ids`` and
``logprobs`` — so it is prompted with exactly the ids the session holds, and
the dispatch core continues it across weight updates like any token completion
(docs/operations.md, "Which routes continue"). The answer is written back in
the chat shape vLLM 0.32 uses (``chat.completion``: ``message`` with the
``tool_calls`` its tool parser would give, :mod:`._tools`; ``logprobs.content``
entries ``{token, logprob, bytes, top_logprobs}``, ``token_ids``,
``prompt_token_ids`` with ``return_token_ids``), plus the choice's
``weight_versions`` spans and a ``session`` object ``{"id", "turn", "branch"}``.
A streamed turn's chunks are :mod:`._stream`'s.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import orjson

from trioforward.sessions._history import Rendered
from trioforward.sessions._store import SessionError, Turn
from trioforward.sessions._tools import parse_tool_calls, parses

__all__ = [
    "completion_body",
    "answer_message",
    "chat_answer",
    "record_turn",
    "check_body",
    "session_servable",
    "chat_entries",
]

# Chat fields a token completion takes as they are (vLLM's sampling fields).
_KEPT = (
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "logit_bias", "bad_words",
    "allowed_token_ids", "include_stop_str_in_output", "user", "priority",
)  # fmt: skip
# Chat features the engine applies to the parsed message or a grammar: a token
# completion cannot carry them, so a session turn refuses them (400).
_REFUSED = (
    "n",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)
# tool_choice values a session turn serves: "required" and a named function make
# the engine force a call with a grammar (vLLM's chat route), which it cannot.
_TOOL_CHOICES = (None, "auto", "none")


def _refusal(body: dict[str, Any]) -> str | None:
    for key in _REFUSED:
        value = body.get(key)
        if value and not (key == "n" and value == 1):
            return key
    return None if body.get("tool_choice") in _TOOL_CHOICES else "tool_choice"


def session_servable(body: dict[str, Any]) -> bool:
    """Whether a chat body can be a session turn: one sample, no grammar, no forced
    tool call (the gateway forwards any other as a plain chat request)."""
    return _refusal(body) is None


def check_body(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """The turn's ``(messages, tools)``; raises :class:`SessionError` 400 for what a
    session turn cannot serve."""
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise SessionError(
            400, "messages must be a non-empty list of message objects", "invalid_messages"
        )
    key = _refusal(body)
    if key is not None:
        raise SessionError(
            400,
            f"{key!r} is not supported on a session turn (X-Session-Id): one sample, no grammar, no forced tool call (docs/sessions.md)",
            "unsupported_in_session",
        )
    return messages, body.get("tools")


def completion_body(body: dict[str, Any], prompt: list[int], parser: str) -> dict[str, Any]:
    """The engine's ``/v1/completions`` body for a chat turn ``body`` prompted with
    ``prompt``; ``parser``: the deployment's tool parser (:mod:`._tools`: where it
    parses, the engine keeps special tokens in the text, as vLLM's chat route
    asks it to). A streamed turn streams, with the caller's ``stream_options``."""
    out = {key: body[key] for key in _KEPT if key in body}
    out["prompt"] = prompt
    budget = body.get("max_completion_tokens", body.get("max_tokens"))
    if budget is not None:
        out["max_tokens"] = budget
    top = body.get("top_logprobs")
    out["logprobs"] = max(top if type(top) is int else 0, 1)  # the trajectory keeps each token's
    out["return_token_ids"] = True
    if parses(parser, body):
        out["skip_special_tokens"] = False
    if body.get("stream"):
        out["stream"] = True
        if isinstance(body.get("stream_options"), dict):
            out["stream_options"] = body["stream_options"]
    return out


def answer_message(
    text: str, body: dict[str, Any], parser: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(message, kept)``: the chat answer's ``message`` for the engine's ``text``
    in vLLM's shape (``tool_calls`` present only when the parser found calls:
    :mod:`._tools`), and the assistant message the session keeps for the next
    turn's comparison (``content``, ``tool_calls``)."""
    content: str | None = text
    calls: list[dict[str, Any]] = []
    if parses(parser, body):
        content, calls = parse_tool_calls(text)
        if body.get("parallel_tool_calls") is False:
            calls = calls[:1]
    message: dict[str, Any] = {
        "role": "assistant", "content": content, "refusal": None, "annotations": None,
        "audio": None, "function_call": None,
    }  # fmt: skip
    kept: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = kept["tool_calls"] = calls
    message["reasoning"] = None
    return message, kept


def record_turn(
    answer: dict[str, Any], rendered: Rendered, started: float, engine: str, version: str | None
) -> tuple[Turn, dict[str, Any]]:
    """The :class:`Turn` an engine's completion ``answer`` makes, and its only choice;
    raises :class:`SessionError` 502 when the answer has no token ids."""
    choices = answer.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    choice: dict[str, Any] = first if isinstance(first, dict) else {}
    ids = choice.get("token_ids")
    if not isinstance(ids, list):
        raise SessionError(
            502,
            f"{engine} answered without token_ids (a session needs an engine that honours return_token_ids: vLLM >= 0.10)",
            "no_token_ids",
        )
    block = _block(choice)
    lps = [x if isinstance(x, int | float) else np.nan for x in block.get("token_logprobs") or []]
    spans = choice.get("weight_versions") or [{"version": version, "start": 0, "end": len(ids)}]
    turn = Turn(
        prompt_ids=np.asarray(rendered.ids, dtype=np.int32),
        token_ids=np.asarray(ids, dtype=np.int32),
        logprobs=np.asarray(lps if len(lps) == len(ids) else [np.nan] * len(ids), dtype=np.float32),
        new_start=rendered.new_start,
        branch=rendered.branch_reason is not None,
        branch_reason=rendered.branch_reason,
        weight_versions=spans,
        started=started,
        finished=time.time(),
        engine=engine,
        finish_reason=choice.get("finish_reason"),
    )
    return turn, choice


def _block(choice: dict[str, Any]) -> dict[str, Any]:
    """A completion choice's ``logprobs`` object (``{}`` when absent)."""
    block = choice.get("logprobs")
    return block if isinstance(block, dict) else {}


def chat_entries(block: dict[str, Any], k: int) -> list[dict[str, Any]]:
    out = []
    tops = block.get("top_logprobs") or []
    for i, (token, lp) in enumerate(
        zip(block.get("tokens") or [], block.get("token_logprobs") or [], strict=False)
    ):
        top = list((tops[i] if i < len(tops) and tops[i] else {}).items())[:k]
        out.append({
            "token": token, "logprob": lp, "bytes": list(str(token).encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top],
        })  # fmt: skip
    return out


def chat_answer(
    body: dict[str, Any],
    answer: dict[str, Any],
    choice: dict[str, Any],
    message: dict[str, Any],
    turn: Turn,
    session: dict[str, Any],
    request_id: str,
) -> bytes:
    """The chat completion the caller gets for a session turn (module docstring);
    ``message`` from :func:`answer_message`, ``session`` the answer's ``session``
    object."""
    ids = bool(body.get("return_token_ids"))
    top = body.get("top_logprobs")
    block = _block(choice)
    doc = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(turn.finished),
        "model": answer.get("model") or body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": chat_entries(block, top if type(top) is int else 0)}
                if body.get("logprobs")
                else None,
                "finish_reason": "tool_calls" if message.get("tool_calls") else turn.finish_reason,
                "stop_reason": choice.get("stop_reason"),
                "token_ids": turn.token_ids.tolist() if ids else None,
                "weight_versions": turn.weight_versions,
            }
        ],  # fmt: skip
        "usage": answer.get("usage"),
        "prompt_token_ids": turn.prompt_ids.tolist() if ids else None,
        "session": session,
    }
    return orjson.dumps(doc)
