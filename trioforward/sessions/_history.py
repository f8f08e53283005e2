"""Where a turn's messages leave the session's history, and the tokens a turn
adds (docs/sessions.md, "How a turn is built").

A turn *extends* the session when its messages are the previous turn's
messages, then an assistant message equal to what the gateway answered (same
``content`` and ``tool_calls``: :func:`~._tools.same_tool_calls`), then new messages.
Its prompt is then::

    previous prompt + sampled ids + close + new

- ``close``: what the template writes after an assistant message's content
  (ChatML: ``<|im_end|>\\n``), found as the common end of two renders of the
  previous messages with a one-letter assistant message ("a", "b"); its first
  token is not added again when it is the last sampled one (the stop token the
  model produced, kept in ``token_ids``).
- ``new``: the new messages' tokens, rendered in the real history (the full
  render minus the render of the history up to the assistant message) when the
  template is prefix-stable there, else in a one-message stand-in history
  (templates that re-render earlier turns once more follow, as Qwen3's drops
  earlier reasoning blocks); when neither is prefix-stable the turn is rendered
  whole and recorded as a branch.

Nothing here does I/O beyond the renderer's awaits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from trioforward.sessions._store import Session
from trioforward.sessions._tools import same_tool_calls

__all__ = ["Rendered", "turn_prompt", "extends"]

Render = Callable[[list[dict[str, Any]], bool], Awaitable[list[int]]]
# The stand-in history the new messages are rendered after when the real one is
# not prefix-stable: one user message, which every template accepts first.
_STAND_IN = [{"role": "user", "content": "x"}]


class Rendered:
    """A turn's prompt: ``ids`` (the whole prompt), ``new_start`` (where the
    tokens this turn added begin; 0 on a first turn or a branch) and
    ``branch_reason`` (``None`` unless the turn was rendered whole after history)."""

    __slots__ = ("ids", "new_start", "branch_reason")

    def __init__(self, ids: list[int], new_start: int, branch_reason: str | None) -> None:
        self.ids, self.new_start, self.branch_reason = ids, new_start, branch_reason


def _plain(m: Any) -> Any:
    # The SDKs echo messages with every optional field present and None.
    return {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m


def _same_assistant(sent: Any, answered: dict[str, Any]) -> bool:
    if not isinstance(sent, dict) or sent.get("role") != "assistant":
        return False
    return (sent.get("content") or "") == (answered.get("content") or "") and same_tool_calls(
        sent.get("tool_calls"), answered.get("tool_calls")
    )


def extends(session: Session, messages: list[Any], tools: Any) -> str | None:
    """``None`` when ``messages`` extend the session's history, else why not
    (``"history_edited"``, ``"history_truncated"``, ``"tools_changed"``)."""
    prev = session.messages
    if len(messages) <= len(prev):
        return "history_truncated"
    if (tools or None) != (session.tools or None):
        return "tools_changed"
    # The earlier messages are the caller's own, sent again: equal as sent (an
    # assistant message the caller wrote with tool calls stays one); only the last
    # assistant message is the gateway's answer, compared by what was sampled.
    for sent, kept in zip(messages, prev[:-1], strict=False):
        if _plain(sent) != _plain(kept):
            return "history_edited"
    if not _same_assistant(messages[len(prev) - 1], prev[-1]):
        return "history_edited"
    return None


def _close(a: list[int], b: list[int]) -> list[int]:
    """What two renders that differ only in an assistant message's one-letter
    content share at their end: what the template writes after the content."""
    n = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if x != y:
            break
        n += 1
    return a[len(a) - n :] if n < len(a) else []


def _after(longer: list[int], prefix: list[int]) -> list[int] | None:
    """``longer`` past ``prefix`` when it starts with it, else ``None``."""
    n = len(prefix)
    return longer[n:] if longer[:n] == prefix else None


async def turn_prompt(
    session: Session, messages: list[dict[str, Any]], tools: Any, render: Render
) -> Rendered:
    """The prompt of the session's next turn (module docstring); ``render(messages,
    add_generation_prompt)`` renders with the turn's ``tools``. Raises what
    ``render`` raises (a :class:`~trioforward.sessions.SessionError`)."""
    if not session.turns:
        return Rendered(await render(messages, True), 0, None)
    why = extends(session, messages, tools)
    if why is not None:
        return Rendered(await render(messages, True), 0, why)
    prev = session.messages  # the previous turn's messages + the sampled assistant message
    new = messages[len(prev) :]
    last = session.turns[-1]
    sampled = last.token_ids.tolist()
    close = _close(
        await render([*prev[:-1], {"role": "assistant", "content": "a"}], False),
        await render([*prev[:-1], {"role": "assistant", "content": "b"}], False),
    )
    if sampled and close and sampled[-1] == close[0]:  # the stop token the model produced: once
        close = close[1:]
    added = _after(await render(messages, True), await render(prev, False))
    if added is None:
        added = _after(await render([*_STAND_IN, *new], True), await render(_STAND_IN, False))
    if added is None:
        return Rendered(await render(messages, True), 0, "template_not_incremental")
    start = len(last.prompt_ids) + len(sampled)
    ids = np.concatenate([last.prompt_ids, last.token_ids]).tolist() + close + added
    return Rendered(ids, start, None)
