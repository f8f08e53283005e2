"""Tool calls in a session turn's answer, parsed as the engine's chat route parses
them (docs/sessions.md, "Tool calls").

A session turn reaches the engine as a token completion, so the engine's own
tool parser (which runs on its chat route only) never sees the output; the
gateway applies the same rules to the engine's text instead. The rules are
vLLM 0.32's ``hermes`` parser (``vllm/tool_parsers/hermes_tool_parser.py``,
``Hermes2ProToolParser``; ``qwen3_json`` is its alias there), as the chat route
applies it with ``tool_choice`` ``auto`` (``vllm/parser/abstract_parser.py``,
``_extract_tool_calls``; ``vllm/entrypoints/openai/chat_completion/serving.py``):

- parsed only when the request has ``tools`` and ``tool_choice`` is absent or
  ``"auto"`` (``"none"``: never parsed);
- no ``<tool_call>`` in the text: the text is the content, no calls;
- each ``<tool_call>JSON</tool_call>`` (or a last ``<tool_call>JSON`` the output
  ended in) is one call: ``JSON`` an object with a string ``name`` and
  ``arguments`` (any JSON value, given back as ``json.dumps(arguments,
  ensure_ascii=False)``); when any of them is not, nothing is parsed and the
  whole text is the content;
- the content is the text before the first ``<tool_call>``, ``None`` when it is
  empty or only whitespace; each call gets id ``chatcmpl-tool-<32 hex>``;
- ``parallel_tool_calls: false`` keeps the first call only
  (``vllm/entrypoints/serve/utils/tool_calls_utils.py``);
- with a call, ``finish_reason`` is ``"tool_calls"``.

vLLM's parser also has the engine detokenize with ``skip_special_tokens``
false when it may parse (``adjust_request``: some models mark ``<tool_call>``
special): :func:`parses` tells the turn to ask the same.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from trioforward._settings import TOOL_PARSERS

__all__ = ["TOOL_PARSERS", "parses", "parse_tool_calls", "same_tool_calls"]


_START = "<tool_call>"
_CALLS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def parses(parser: str, body: dict[str, Any]) -> bool:
    """Whether a chat ``body`` has its answer's tool calls parsed under ``parser``."""
    return (
        parser != "none" and bool(body.get("tools")) and body.get("tool_choice") in (None, "auto")
    )


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a model output ``text`` (module docstring);
    ``tool_calls`` in OpenAI's shape ``[{"id", "type": "function", "function":
    {"name", "arguments": str}}]``, empty when none was parsed (then
    ``content`` is ``text``)."""
    if _START not in text:
        return text, []
    calls = []
    for closed, open_ in _CALLS.findall(text):
        try:
            call = json.loads(closed or open_)
        except ValueError:
            return text, []
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("name"), str)
            or "arguments" not in call
        ):
            return text, []
        arguments = json.dumps(call["arguments"], ensure_ascii=False)
        calls.append({
            "id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
            "function": {"name": call["name"], "arguments": arguments},
        })  # fmt: skip
    content = text[: text.find(_START)]
    return (content if content.strip() else None), calls


def _arguments(value: Any) -> Any:
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return value


def same_tool_calls(sent: Any, answered: Any) -> bool:
    """Whether the ``tool_calls`` of an assistant message a caller sent back are
    those the gateway answered: same ids (where sent), names and arguments
    (equal as JSON: a harness may re-serialize them)."""
    sent, answered = sent or [], answered or []
    if not isinstance(sent, list) or len(sent) != len(answered):
        return False
    for mine, theirs in zip(sent, answered, strict=True):
        if not isinstance(mine, dict) or not isinstance(mine.get("function"), dict):
            return False
        if mine.get("id") is not None and mine["id"] != theirs["id"]:
            return False
        fn, kept = mine["function"], theirs["function"]
        if fn.get("name") != kept["name"]:
            return False
        if _arguments(fn.get("arguments")) != _arguments(kept["arguments"]):
            return False
    return True
