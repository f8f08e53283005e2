"""Session turns over real chat templates (docs/sessions.md, "How a turn is built",
"Rendering"): Qwen3's (tool calls, reasoning blocks it drops on re-render) and the
tiny vLLM test model's, with a local tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from renderers import QWEN3_TEMPLATE, TINY_TEMPLATE, model_dir

from trioforward.sessions import LocalRenderer, Session, SessionError, Turn
from trioforward.sessions._history import turn_prompt

TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]


def _session(
    messages: list[dict[str, Any]], prompt: list[int], sampled: list[int], tools: Any = None
) -> Session:
    session = Session("s", "default", 0.0, 0.0, tools=tools)
    session.turns.append(Turn(
        np.asarray(prompt, np.int32), np.asarray(sampled, np.int32), np.zeros(len(sampled), np.float32),
        0, False, None, [], 0.0, 0.0, "e", "stop",
    ))  # fmt: skip
    session.messages = messages
    return session


def _render(renderer: LocalRenderer, tools: Any) -> Any:
    async def render(messages: list[dict[str, Any]], generation: bool) -> list[int]:
        return await renderer.chat_ids(messages, tools, generation)

    return render


def _ids(renderer: LocalRenderer, text: str) -> list[int]:
    return list(renderer.tokenizer.encode(text, add_special_tokens=False).ids)


async def test_qwen3_drops_sampled_reasoning_on_rerender_a_session_keeps_every_sampled_token(
    tmp_path: Path,
) -> None:
    renderer = LocalRenderer.from_directory(model_dir(tmp_path, QWEN3_TEMPLATE))
    first = [{"role": "user", "content": "fix tests/test_x.py"}]
    p1 = await renderer.chat_ids(first, TOOLS, True)
    assert renderer.render_text(first, TOOLS, True).endswith("<|im_start|>assistant\n")
    # What the model sampled, stop token included, and the text the gateway answered.
    reply = '<think>\nLet me run the tests first.\n</think>\n\n<tool_call>\n{"name": "run_tests", "arguments": {}}\n</tool_call>'
    sampled = _ids(renderer, reply + "<|im_end|>")
    session = _session([*first, {"role": "assistant", "content": reply}], p1, sampled, TOOLS)
    second = [
        *session.messages,
        {"role": "tool", "content": "1 failed"},
        {"role": "user", "content": "again"},
    ]

    rendered = await turn_prompt(session, second, TOOLS, _render(renderer, TOOLS))

    assert rendered.branch_reason is None and rendered.new_start == len(p1) + len(sampled)
    assert rendered.ids[: rendered.new_start] == p1 + sampled
    tail = "\n<|im_start|>user\n<tool_response>\n1 failed\n</tool_response><|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    assert rendered.ids[rendered.new_start :] == _ids(renderer, tail)
    # Without a session the history is re-rendered: the reasoning the model sampled is gone.
    whole = await renderer.chat_ids(second, TOOLS, True)
    assert whole[: len(p1)] == p1 and whole[len(p1) : len(p1) + len(sampled)] != sampled
    assert "Let me run" not in renderer.render_text(second, TOOLS, True)


async def test_qwen3_turn_after_a_plain_answer_renders_the_tool_result_after_a_stand_in(
    tmp_path: Path,
) -> None:
    # A plain answer (no reasoning) is rendered with an empty think block while it
    # is last, without once a tool result follows: the real history is not
    # prefix-stable, the stand-in is.
    renderer = LocalRenderer.from_directory(model_dir(tmp_path, QWEN3_TEMPLATE))
    first = [
        {"role": "system", "content": "You fix failing tests."},
        {"role": "user", "content": "go"},
    ]
    p1 = await renderer.chat_ids(first, None, True)
    sampled = _ids(renderer, "run the tests")  # stopped by length: no stop token
    session = _session([*first, {"role": "assistant", "content": "run the tests"}], p1, sampled)
    second = [*session.messages, {"role": "tool", "content": "ok"}]
    rendered = await turn_prompt(session, second, None, _render(renderer, None))
    assert rendered.branch_reason is None
    assert rendered.ids[: rendered.new_start] == p1 + sampled
    # The template's close of an assistant turn after the sampled text, then the tool result.
    tail = "<|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert rendered.ids[rendered.new_start :] == _ids(renderer, tail)


async def test_tiny_vllm_test_model_template_extends_without_a_branch(tmp_path: Path) -> None:
    renderer = LocalRenderer.from_directory(model_dir(tmp_path, TINY_TEMPLATE, eos="</s>"))
    first = [{"role": "user", "content": "Hello, how are you?"}]
    p1 = await renderer.chat_ids(first, None, True)
    assert p1 == _ids(renderer, "user: Hello, how are you?\nassistant:")
    sampled = [7, 8, 9]
    session = _session([*first, {"role": "assistant", "content": "fine"}], p1, sampled)
    second = [*session.messages, {"role": "user", "content": "thank you"}]
    rendered = await turn_prompt(session, second, None, _render(renderer, None))
    assert rendered.branch_reason is None
    assert rendered.ids == p1 + sampled + _ids(renderer, "\n") + _ids(
        renderer, "user: thank you\nassistant:"
    )


async def test_an_edited_history_is_rendered_whole_as_a_branch(tmp_path: Path) -> None:
    renderer = LocalRenderer.from_directory(model_dir(tmp_path, QWEN3_TEMPLATE))
    first = [{"role": "user", "content": "go"}]
    p1 = await renderer.chat_ids(first, None, True)
    session = _session([*first, {"role": "assistant", "content": "a"}], p1, _ids(renderer, "a"))
    edited = [*first, {"role": "assistant", "content": "b"}, {"role": "user", "content": "next"}]
    rendered = await turn_prompt(session, edited, None, _render(renderer, None))
    assert rendered.branch_reason == "history_edited" and rendered.new_start == 0
    assert rendered.ids == await renderer.chat_ids(edited, None, True)
    truncated = await turn_prompt(session, first, None, _render(renderer, None))
    assert truncated.branch_reason == "history_truncated"
    tools = await turn_prompt(
        session,
        [*session.messages, {"role": "user", "content": "x"}],
        TOOLS,
        _render(renderer, TOOLS),
    )
    assert tools.branch_reason == "tools_changed"


async def test_a_template_error_is_a_clear_400(tmp_path: Path) -> None:
    strict = (
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('Conversation roles must be user or assistant') }}{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    renderer = LocalRenderer.from_directory(model_dir(tmp_path / "strict", strict))
    with pytest.raises(SessionError) as refused:
        await renderer.chat_ids([{"role": "tool", "content": "x"}], None, True)
    assert refused.value.status == 400 and refused.value.code == "render_failed"
    assert "Conversation roles must be user or assistant" in refused.value.message
    broken = LocalRenderer.from_directory(
        model_dir(tmp_path / "broken", "{{ messages[5]['content'] + 1 }}")
    )
    with pytest.raises(SessionError) as failed:
        await broken.chat_ids([{"role": "user", "content": "x"}], None, True)
    assert failed.value.status == 400 and "the chat template failed" in failed.value.message


async def test_a_branch_with_caller_written_tool_calls_is_extended_after(tmp_path: Path) -> None:
    # The caller rewrote the answer as a tool call (a branch); its next turn sends
    # that message again unchanged and extends the branch, not a branch per turn.
    renderer = LocalRenderer.from_directory(model_dir(tmp_path, QWEN3_TEMPLATE))
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}
        ],
    }
    history = [{"role": "user", "content": "go"}, call, {"role": "tool", "content": "ok"}]
    p1 = await renderer.chat_ids(history, TOOLS, True)
    sampled = _ids(renderer, "done<|im_end|>")
    session = _session([*history, {"role": "assistant", "content": "done"}], p1, sampled, TOOLS)
    nxt = [*session.messages, {"role": "user", "content": "more"}]
    rendered = await turn_prompt(session, nxt, TOOLS, _render(renderer, TOOLS))
    assert rendered.branch_reason is None and rendered.ids[: len(p1) + len(sampled)] == p1 + sampled
