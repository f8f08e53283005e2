"""The session tool-call parser against vLLM's own (docs/sessions.md, "Tool calls"):
the same texts through vLLM 0.32's ``Hermes2ProToolParser`` and through
``trioforward.sessions._tools`` give the same content, names and arguments. No
server: the parser is pure text (the tokenizer it is built with is not read)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trioforward.sessions._tools import parse_tool_calls

CALL = '{"name": "run_tests", "arguments": {"path": "tests/x.py", "k": "ü", "n": [1, 2.5]}}'
TEXTS = [
    "no call at all",
    f"<tool_call>\n{CALL}\n</tool_call>",
    f"Let me check.\n<tool_call>{CALL}</tool_call>",
    f"  \n<tool_call>{CALL}</tool_call>\n<tool_call>{CALL}</tool_call>",
    f'<tool_call>{CALL}</tool_call><tool_call>{{"name": "b", "arguments": "s"}}',
    "<tool_call>{not json}</tool_call>",
    f'<tool_call>{CALL}</tool_call><tool_call>{{"name": "b"}}</tool_call>',
    '<tool_call>["a", "b"]</tool_call>',
    "<tool_call></tool_call>",
    '<tool_call>{"name": "a", "arguments": null}</tool_call> trailing',
]


def _vllm(text: str) -> tuple[str | None, list[tuple[str, Any]]]:
    pytest.importorskip("vllm")
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    got = Hermes2ProToolParser(tokenizer=object()).extract_tool_calls(text, request=None)  # type: ignore[arg-type]
    content = got.content
    if got.tools_called and content is not None and not content.strip():
        content = None  # the chat route's rule (vllm/parser/abstract_parser.py)
    calls = [(c.function.name, c.function.arguments) for c in got.tool_calls]
    return content, calls


@pytest.mark.parametrize("text", TEXTS)
def test_same_calls_and_content_as_vllms_hermes_parser(text: str) -> None:
    content, calls = parse_tool_calls(text)
    mine = (content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls])
    assert mine == _vllm(text)
    for _, arguments in mine[1]:
        json.loads(arguments)
