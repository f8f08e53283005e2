"""The OpenAI stream shapes a continued stream reads and writes (docs/operations.md,
"Which routes continue"): ``/v1/completions`` and ``/v1/chat/completions`` events,
and the SSE framing every stream shares.

A continued stream (:mod:`trioforward.dispatch.rollout._continue_stream`) keeps
each choice as completion-shaped segments (``token_ids``, ``text``,
``logprobs``, ``finish_reason``, ``stop_reason``); an :class:`Events` is what it
asks of the caller's shape: an event's choices read as segments, the prompt ids
they carry, the budget, the continuation's request, and a segment written back
as the caller's event. The token routes' shapes are in :mod:`._streams`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from trioforward.dispatch.dialects import _chat

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "COMPLETIONS",
    "CHAT",
    "UNSET",
    "ABORTS",
    "Events",
    "ChatEvents",
    "sse_event",
    "events_end",
    "split",
    "payload",
    "continuation_body",
]

#: ``max_tokens`` of a ``/v1/completions`` request that gives none: vLLM's
#: ``CompletionRequest.max_tokens`` default (``vllm/entrypoints/openai/protocol.py``)
#: and SGLang's (docs/operations.md). A continuation is sent with what is left of
#: it, never with the engine's default again.
DEFAULT_MAX_TOKENS = 16
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
#: A budget the caller left to the engine (a continuation names none either).
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "UNSET"})()
#: How an engine's body or event says a choice was aborted: vLLM, SGLang's OpenAI
#: routes (orjson/FastAPI write no spaces), SGLang's ``/generate``. Byte searches:
#: an answer is not parsed to find them.
ABORTS = (
    b'"finish_reason":"abort"',
    b'"finish_reason": "abort"',
    b'"finish_reason":{"type":"abort"',
    b'"finish_reason": {"type": "abort"',
)
_BOUNDARY = re.compile(rb"\r?\n\r?\n")
_HEAD = ("id", "object", "created", "model")
# Keys a continuation does not send again: it is one sequence whose prompt (the
# caller's prompt + the tokens so far) needs no echo or prompt logprobs.
_DROPPED = ("stream", "stream_options", "echo", "prompt_logprobs", "n", "best_of", "suffix")


def continuation_body(
    body: dict[str, Any], ids: list[int], left: int, stream: bool = False
) -> bytes:
    """The ``/v1/completions`` body going on from token ``ids`` (prompt + tokens so
    far): ``n: 1``, ``max_tokens: left``, token ids asked, ``body``'s other fields;
    ``stream``: streamed (without a usage chunk)."""
    out = {k: v for k, v in body.items() if k not in _DROPPED}
    out["prompt"] = ids
    out["max_tokens"] = left
    out["return_token_ids"] = True
    if stream:
        out["stream"] = True
    return orjson.dumps(out)


def events_end(data: bytes) -> int:
    """Length of the complete SSE events at the start of ``data`` (up to the last
    blank line; WHATWG HTML, event stream parsing)."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def split(block: bytes) -> list[bytes]:
    """The events of ``block`` (whole events), each ending with a blank line."""
    return [e + b"\n\n" for e in _BOUNDARY.split(block) if e.strip()]


def payload(event: bytes) -> Any:
    """The JSON of one ``data:`` event, ``None`` for ``[DONE]`` or anything else."""
    data = b"".join(
        line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")
    )
    if not data or data == b"[DONE]":
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def usage(doc: Any, gens: list[Any], prompt: int = 0) -> dict[str, Any]:
    """``doc``'s ``usage`` counting every generated token of ``gens`` (``prompt``: the
    prompt's tokens when ``doc`` does not say)."""
    use = dict(doc.get("usage") or {})
    prompt = int(use.get("prompt_tokens") or prompt)
    completion = sum(len(g.tokens) for g in gens)
    use.update(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    return use


def sse_event(doc: Any) -> bytes:
    """One SSE ``data:`` event of JSON ``doc``."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"


class Events:
    """A ``/v1/completions`` stream: its choices are segments as they are.

    ``body``: the caller's parsed request body. ``path``: where a continuation
    goes; ``native``: an engine's own route, whose abort events go to the caller
    as they are when it cannot be continued (its clients read them); the
    OpenAI routes end with an error event instead.
    """

    __slots__ = ("body",)
    path = COMPLETIONS
    native = False

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def head(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The envelope fields every event the gateway writes repeats."""
        return {k: doc.get(k) for k in _HEAD}

    def choices(self, doc: Any) -> list[Any]:
        """The per-choice parts of one event or answer."""
        choices = doc.get("choices") if isinstance(doc, dict) else None
        return choices if isinstance(choices, list) else []

    def read(self, raw: dict[str, Any], state: dict[int, Any]) -> dict[str, Any] | None:
        """An event's choice as a segment (``None``: not continuable); ``state``:
        this stream's own, for shapes that repeat what they sent."""
        return raw

    def segment(self, raw: Any, state: dict[int, Any]) -> dict[str, Any] | None:
        """Choice ``raw`` read as a segment with a ``token_ids`` list (:meth:`read`);
        ``None`` when it has none (an abort event that adds nothing gets an empty one)."""
        choice = self.read(raw, state) if isinstance(raw, dict) else None
        if choice is None:
            return None
        ids = choice.get("token_ids")
        if ids is None and choice.get("finish_reason") == "abort" and not choice.get("text"):
            return {**choice, "token_ids": []}
        return choice if isinstance(ids, list) else None

    def whole(self, doc: Any) -> list[tuple[int, list[int], dict[str, Any]]] | str:
        """A whole answer's choices as ``(index, prompt ids, first segment)``, or why
        it cannot be continued: ``"ids"`` (no token ids) or ``"route"``."""
        choices = self.choices(doc)
        out = []
        for n, choice in enumerate(choices):
            ids = choice.get("token_ids") if isinstance(choice, dict) else None
            prompt = choice.get("prompt_token_ids") if isinstance(choice, dict) else None
            if not isinstance(ids, list) or not isinstance(prompt, list):
                return "ids"
            index = choice.get("index")
            out.append((index if isinstance(index, int) else n, prompt, choice))
        return out or "route"

    def joined(self, doc: Any, gens: list[Any], ids: bool) -> bytes:
        """The one answer of a continued whole answer: ``doc``'s envelope, each choice
        joined from its segments (``ids``: keep the token-id lists), usage over every
        generated token."""
        choices = [g.rendered(g.index, ids) for g in gens]
        return orjson.dumps({**doc, "choices": choices, "usage": usage(doc, gens)})

    def prompt(self, doc: dict[str, Any], raw: dict[str, Any]) -> list[int] | None:
        """The prompt ids an event carries for its choice ``raw``."""
        return raw.get("prompt_token_ids")

    def known_prompt(self, index: int) -> list[int]:
        """The prompt ids of choice ``index`` when the events do not carry them."""
        return []

    def base(self, segment: dict[str, Any]) -> dict[str, Any]:
        """A new choice's first segment (logprobs kept when its first event has them)."""
        return {"text": "", "token_ids": [], "logprobs": segment.get("logprobs")}

    def continuable(self) -> bool:
        """The request can be continued (its budget and prompt ids can be known)."""
        return True

    def count(self) -> int:
        """How many choices the stream has (the caller's ``n``)."""
        n = self.body.get("n", 1)
        return n if type(n) is int and n > 0 else 1

    def budget(self, index: int) -> Any:
        """Choice ``index``'s token budget: an int, ``None`` (no limit) or :data:`UNSET`."""
        budget = self.body.get("max_tokens")
        return budget if type(budget) is int else DEFAULT_MAX_TOKENS

    def continuation(self, gen: Any, left: Any, stream: bool) -> bytes:
        """The body of a continuation of ``gen`` with ``left`` tokens to go."""
        return continuation_body(self.fields(), gen.prompt + gen.tokens, left, stream)

    def fields(self) -> dict[str, Any]:
        """The caller's fields a ``/v1/completions`` continuation is sent with."""
        return self.body

    def sub_events(self) -> Events:
        """The shape of a continuation's own events."""
        return self

    def event(self, head: dict[str, Any], gen: Any, out: dict[str, Any], index: int) -> bytes:
        """Segment choice ``out`` (the new part of ``gen``) written as the caller's event."""
        out["index"] = index
        return sse_event({**head, "choices": [out]})

    def closing(self, head: dict[str, Any], gens: list[Any], usage: list[Any]) -> bytes:
        """The end of a continued stream: the usage chunk if asked for, ``[DONE]``."""
        out = b""
        options = self.body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            prompt = int(usage[-1].get("prompt_tokens") or 0) if usage else 0
            completion = sum(len(g.tokens) for g in gens)
            use = {
                "prompt_tokens": prompt,
                "total_tokens": prompt + completion,
                "completion_tokens": completion,
            }
            out = sse_event({**head, "choices": [], "usage": use})
        return out + b"data: [DONE]\n\n"


class ChatEvents(Events):
    """A ``/v1/chat/completions`` stream, read and written through :mod:`._chat`,
    continued on ``/v1/completions``; the templated prompt's ids come once, on
    the stream's first chunk."""

    __slots__ = ("seen",)

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.seen: list[int] | None = None

    def read(self, raw: dict[str, Any], state: dict[int, Any]) -> dict[str, Any] | None:
        return _chat.completion_choice(raw)

    def prompt(self, doc: dict[str, Any], raw: dict[str, Any]) -> list[int] | None:
        ids = doc.get("prompt_token_ids")
        if isinstance(ids, list) and ids:
            self.seen = ids
        return self.seen

    def known_prompt(self, index: int) -> list[int]:
        return self.seen or []

    def base(self, segment: dict[str, Any]) -> dict[str, Any]:
        logprobs: dict[str, Any] | None = {} if self.body.get("logprobs") else None
        return {"text": "", "token_ids": [], "logprobs": logprobs}

    def continuable(self) -> bool:
        return _chat.budget_of(self.body) is not None

    def budget(self, index: int) -> Any:
        return _chat.budget_of(self.body)

    def fields(self) -> dict[str, Any]:
        return _chat.tokens_body(self.body)

    def sub_events(self) -> Events:
        return Events(self.body)

    def whole(self, doc: Any) -> list[tuple[int, list[int], dict[str, Any]]] | str:
        prompt = doc.get("prompt_token_ids") if isinstance(doc, dict) else None
        choices = self.choices(doc)
        if not self.continuable() or not choices:
            return "route"
        if not isinstance(prompt, list) or not prompt:
            return "ids"
        out = []
        for n, choice in enumerate(choices):
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict) or message.get("tool_calls") or message.get("reasoning"):
                return "route"
            if not isinstance(choice.get("token_ids"), list):
                return "ids"
            # The first segment's logprobs stay as the engine wrote them; the
            # continuations' are collected (completion shape) and converted.
            logprobs: dict[str, Any] | None = {} if isinstance(choice.get("logprobs"), dict) else None
            first = {"text": message.get("content") or "", "logprobs": logprobs}
            out.append((n, prompt, {**choice, **first}))
        return out

    def joined(self, doc: Any, gens: list[Any], ids: bool) -> bytes:
        choices = []
        for choice, gen in zip(doc["choices"], gens, strict=True):
            joined = {**choice, "message": {**choice["message"], "content": gen.text}}
            if isinstance(choice.get("logprobs"), dict):
                first = choice["logprobs"].get("content") or []
                more = _chat.chat_entries(gen.logprobs, _chat.top_k(self.body))
                joined["logprobs"] = {**choice["logprobs"], "content": first + more}
            joined["finish_reason"], joined["stop_reason"] = gen.finish, gen.stop
            joined["token_ids"] = gen.tokens if ids else None
            joined["weight_versions"] = gen.versions()
            choices.append(joined)
        out = {**doc, "choices": choices, "usage": usage(doc, gens)}
        if not ids and "prompt_token_ids" in out:
            out["prompt_token_ids"] = None
        return orjson.dumps(out)

    def event(self, head: dict[str, Any], gen: Any, out: dict[str, Any], index: int) -> bytes:
        return _chat.chat_event(head, out, index, _chat.top_k(self.body))
