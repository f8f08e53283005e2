"""Tool calls parsed from a session turn's text by vLLM 0.32's hermes rules
(docs/sessions.md, "Tool calls"): each case is one of the parser's branches
(``vllm/tool_parsers/hermes_tool_parser.py``, ``vllm/parser/abstract_parser.py``)."""

from __future__ import annotations

import json
import re

import pytest

from trioforward.sessions._tools import parse_tool_calls, parses, same_tool_calls
from trioforward.sessions._turn import answer_message, check_body, session_servable

CALL = '<tool_call>\n{"name": "run_tests", "arguments": {"path": "tests/x.py", "k": "ü"}}\n</tool_call>'


def _calls(text: str) -> list[tuple[str, dict[str, object]]]:
    _, calls = parse_tool_calls(text)
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_content_before_the_call_and_the_call_in_openai_shape() -> None:
    content, calls = parse_tool_calls("I will run them.\n" + CALL)
    assert content == "I will run them.\n"
    (call,) = calls
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", call["id"]) and call["type"] == "function"
    # arguments: json.dumps(arguments, ensure_ascii=False), as vLLM gives them back
    assert call["function"] == {
        "name": "run_tests",
        "arguments": '{"path": "tests/x.py", "k": "ü"}',
    }


def test_several_calls_an_unclosed_last_one_and_blank_content() -> None:
    text = '  \n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": [1]}'
    content, calls = parse_tool_calls(text)
    assert content is None  # only whitespace before the first call
    assert _calls(text) == [("a", {}), ("b", [1])]
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b"}</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        '<tool_call>["name", "arguments"]</tool_call>',
        "<tool_call></tool_call>",
    ],
)
def test_a_call_that_does_not_parse_leaves_the_whole_text_as_content(text: str) -> None:
    assert parse_tool_calls("look: " + text) == ("look: " + text, [])


def test_text_without_a_call_is_the_content() -> None:
    assert parse_tool_calls(" t5 t9 tool_call>") == (" t5 t9 tool_call>", [])


def test_when_the_route_parses() -> None:
    tools = [{"type": "function", "function": {"name": "a"}}]
    assert parses("hermes", {"tools": tools}) and parses(
        "qwen3_json", {"tools": tools, "tool_choice": "auto"}
    )
    assert not parses("none", {"tools": tools})
    assert not parses("hermes", {"tools": tools, "tool_choice": "none"})
    assert not parses("hermes", {})  # no tools: the text is the content
    message, kept = answer_message(CALL, {"tools": tools, "tool_choice": "none"}, "hermes")
    assert message["content"] == CALL and "tool_calls" not in message and kept["content"] == CALL
    two = CALL + CALL
    message, kept = answer_message(two, {"tools": tools, "parallel_tool_calls": False}, "hermes")
    assert len(message["tool_calls"]) == 1 and kept["tool_calls"] == message["tool_calls"]
    assert message["content"] is None and message["reasoning"] is None


def test_forced_tool_calls_are_not_session_turns() -> None:
    named = {"type": "function", "function": {"name": "a"}}
    for choice in ("required", named):
        body = {"messages": [{"role": "user", "content": "x"}], "tool_choice": choice}
        assert not session_servable(body)
        with pytest.raises(Exception, match="tool_choice"):
            check_body(body)
    assert session_servable({"messages": [], "stream": True, "tool_choice": "auto"})


def test_a_returned_call_matches_as_sent_or_re_serialized() -> None:
    _, calls = parse_tool_calls(CALL)
    sent = [{**calls[0], "function": {**calls[0]["function"]}}]
    assert same_tool_calls(sent, calls)
    sent[0]["function"]["arguments"] = json.dumps(json.loads(calls[0]["function"]["arguments"]))
    assert same_tool_calls(sent, calls)  # ensure_ascii re-serialized: same JSON
    assert same_tool_calls([{"function": calls[0]["function"]}], calls)  # no id sent
    assert not same_tool_calls([{**sent[0], "id": "call-other"}], calls)
    assert not same_tool_calls([], calls) and not same_tool_calls(None, calls)
    assert same_tool_calls(None, []) and same_tool_calls([], None)
