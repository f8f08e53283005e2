"""The two OpenAI stream shapes a continued stream reads and writes (docs/operations.md,
"Which routes continue"): ``/v1/completions`` and ``/v1/chat/completions`` events.

A continued stream (:mod:`trioforward.dispatch.rollout._continue_stream`) keeps
each choice as completion-shaped segments and continues it on
``/v1/completions``, whatever the caller's route; an :class:`Events` is what it
asks of the caller's shape: how a relayed event's choice reads as a segment,
which prompt ids it carries, the continuation's body fields and budget, and how
a segment is written back as the caller's event.
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.dispatch.dialects import _chat

__all__ = ["DEFAULT_MAX_TOKENS", "COMPLETIONS", "CHAT", "Events", "events_for", "sse_event"]

#: ``max_tokens`` of a ``/v1/completions`` request that gives none: vLLM's
#: ``CompletionRequest.max_tokens`` default (``vllm/entrypoints/openai/protocol.py``)
#: and SGLang's (docs/operations.md). A continuation is sent with what is left of
#: it, never with the engine's default again.
DEFAULT_MAX_TOKENS = 16
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def sse_event(head: dict[str, Any], choice: dict[str, Any], index: int) -> bytes:
    """One ``/v1/completions`` stream event: ``head`` (``id``, ``object``, ``created``,
    ``model``) and one choice, its ``index`` set."""
    choice["index"] = index
    return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"


class Events:
    """A ``/v1/completions`` stream: its choices are segments as they are.

    ``body``: the caller's parsed request body.
    """

    __slots__ = ("body",)

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def read(self, choice: dict[str, Any]) -> dict[str, Any] | None:
        """An event's choice as a completion segment (``None``: not continuable)."""
        return choice

    def prompt(self, doc: dict[str, Any], choice: dict[str, Any]) -> list[int] | None:
        """The prompt ids an event carries for ``choice`` (its first event's)."""
        return choice.get("prompt_token_ids")

    def known_prompt(self) -> list[int]:
        """The prompt ids of every choice, when the stream carries them once (chat)."""
        return []

    def base(self, choice: dict[str, Any]) -> dict[str, Any]:
        """A new choice's first segment (logprobs kept when its first event has them)."""
        return {"text": "", "token_ids": [], "logprobs": choice.get("logprobs")}

    def budget(self) -> int | None:
        """The caller's token budget; ``None``: the stream cannot be continued."""
        budget = self.body.get("max_tokens")
        return budget if type(budget) is int else DEFAULT_MAX_TOKENS

    def fields(self) -> dict[str, Any]:
        """The caller's fields a ``/v1/completions`` continuation is sent with."""
        return self.body

    def event(self, head: dict[str, Any], out: dict[str, Any], index: int) -> bytes:
        """Segment choice ``out`` written as the caller's event."""
        return sse_event(head, out, index)


class ChatEvents(Events):
    """A ``/v1/chat/completions`` stream, read and written through :mod:`._chat`;
    the templated prompt's ids come once, on the stream's first chunk."""

    __slots__ = ("seen",)

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.seen: list[int] | None = None

    def read(self, choice: dict[str, Any]) -> dict[str, Any] | None:
        return _chat.completion_choice(choice)

    def prompt(self, doc: dict[str, Any], choice: dict[str, Any]) -> list[int] | None:
        ids = doc.get("prompt_token_ids")
        if isinstance(ids, list) and ids:
            self.seen = ids
        return self.seen

    def known_prompt(self) -> list[int]:
        return self.seen or []

    def base(self, choice: dict[str, Any]) -> dict[str, Any]:
        logprobs: dict[str, Any] | None = {} if self.body.get("logprobs") else None
        return {"text": "", "token_ids": [], "logprobs": logprobs}

    def budget(self) -> int | None:
        return _chat.budget_of(self.body)

    def fields(self) -> dict[str, Any]:
        return _chat.tokens_body(self.body)

    def event(self, head: dict[str, Any], out: dict[str, Any], index: int) -> bytes:
        return _chat.chat_event(head, out, index, _chat.top_k(self.body))


def events_for(path: str, body: dict[str, Any]) -> Events:
    """The stream shape of route ``path`` (:data:`COMPLETIONS` or :data:`CHAT`)."""
    return ChatEvents(body) if path == CHAT else Events(body)
