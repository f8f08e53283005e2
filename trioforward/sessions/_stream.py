"""A streamed session turn: the engine's completion stream written back as chat
chunks, and what it sampled (docs/sessions.md, "Streamed turns").

The engine streams the turn as a token completion (``/v1/completions`` with
``stream``); each of its events becomes a ``chat.completion.chunk`` in vLLM
0.32's shape (``vllm/entrypoints/openai/chat_completion/serving.py``, the
recording in docs/compatibility.md): a first chunk ``delta: {"role":
"assistant", "content": ""}`` (with ``prompt_token_ids`` when asked, and the
``session`` object), then one chunk per engine event (``delta.content``,
``logprobs.content`` when asked, ``token_ids`` when asked), the last with
``finish_reason``, ``stop_reason`` and the ``weight_versions`` spans; the usage
chunk as the caller's ``stream_options`` asked; ``data: [DONE]``.

Tool calls (:mod:`._tools`) come in the last chunk: while the parser may parse,
text from a ``<tool_call>`` on (or what may be the start of one) is held back;
at the end the calls go as ``delta.tool_calls`` (``index``, ``id``, ``type``,
``function`` with the whole ``arguments``) with ``finish_reason: "tool_calls"``,
or, when nothing parses, the held-back text goes as content.

The turn is complete — and recorded — only when the engine's stream ended with
``[DONE]``; a stream the client left or the engine broke records nothing.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from trioforward.sessions._tools import parses
from trioforward.sessions._turn import answer_message, chat_entries

__all__ = ["StreamedTurn"]

_START = "<tool_call>"


def _overlap(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (a tag that may
    be arriving)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _event(doc: Any) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


class StreamedTurn:
    """One streamed turn: :meth:`events` turns the engine's SSE events into chat
    chunk events; once :attr:`done`, :meth:`answer` is the whole completion
    answer the stream made (as a non-streamed turn's engine answer)."""

    def __init__(
        self,
        body: dict[str, Any],
        prompt: list[int],
        parser: str,
        session: dict[str, Any],
        request_id: str,
    ) -> None:
        self.body, self.prompt, self.parser, self.session = body, prompt, parser, session
        self.parses = parses(parser, body)
        self.head = {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model"),
        }
        self.ids: list[int] = []
        self.tokens: list[Any] = []
        self.lps: list[Any] = []
        self.tops: list[Any] = []
        self.text = ""
        self.sent = 0  # characters of text sent as content
        self.choice: dict[str, Any] = {}  # the engine's ending choice
        self.parsed: tuple[dict[str, Any], dict[str, Any]] | None = None  # answer_message's
        self.usage: Any = None
        self.done = False
        self._started = False
        # Set by whoever streams it: the engine's body, and where and when it ran.
        self.completion: dict[str, Any] = {}
        self.started = 0.0
        self.engine = ""
        self.version: str | None = None
        self.queue_time = 0.0

    def events(self, data: bytes) -> bytes:
        """Whole SSE events of the engine's stream → the caller's chat events."""
        out = []
        if not self._started:
            self._started = True
            ids = self.prompt if self.body.get("return_token_ids") else None
            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}  # fmt: skip
            out.append(
                _event(
                    {
                        **self.head,
                        "choices": [first],
                        "prompt_token_ids": ids,
                        "session": self.session,
                    }
                )
            )
        for line in data.splitlines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = bool(self.choice)
                out.append(b"data: [DONE]\n\n")
                continue
            try:
                doc = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(doc, dict) or "error" in doc:
                out.append(line + b"\n\n")  # the engine's error event, as it sent it
                continue
            out.extend(self._chunk(doc))
        return b"".join(out)

    def _chunk(self, doc: dict[str, Any]) -> list[bytes]:
        if isinstance(doc.get("model"), str):
            self.head["model"] = doc["model"]
        choices = doc.get("choices")
        if not choices:  # the usage chunk
            if doc.get("usage") is None:
                return []
            self.usage = doc["usage"]
            return [_event({**self.head, "choices": [], "usage": doc["usage"]})]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        ids = choice.get("token_ids") or []
        raw = choice.get("logprobs")
        block: dict[str, Any] = raw if isinstance(raw, dict) else {}
        self.ids += ids
        self.tokens += block.get("tokens") or []
        self.lps += block.get("token_logprobs") or []
        self.tops += block.get("top_logprobs") or []
        self.text += choice.get("text") or ""
        top = self.body.get("top_logprobs")
        out = {
            "index": 0,
            "delta": {},
            "logprobs": {"content": chat_entries(block, top if type(top) is int else 0)}
            if self.body.get("logprobs")
            else None,
            "finish_reason": None,
            "token_ids": ids if self.body.get("return_token_ids") else None,
        }
        if choice.get("finish_reason") is None:
            out["delta"] = {"content": self._releasable()}
            return [_event({**self.head, "choices": [out]})]
        self.choice = choice
        self.parsed = answer_message(self.text, self.body, self.parser)
        message = self.parsed[0]
        calls = message.get("tool_calls")
        if calls:
            shown = message["content"] or ""
            out["delta"] = {
                "content": shown[self.sent :],
                "tool_calls": [{"index": i, **call} for i, call in enumerate(calls)],
            }
        else:
            out["delta"] = {"content": self.text[self.sent :]}
        self.sent = len(self.text)
        out["finish_reason"] = "tool_calls" if calls else choice["finish_reason"]
        out["stop_reason"] = choice.get("stop_reason")
        out["weight_versions"] = choice.get("weight_versions")
        return [_event({**self.head, "choices": [out]})]

    def _releasable(self) -> str:
        """The content that can go now: all new text, or while the parser may parse,
        the text before a ``<tool_call>`` (or the start of one)."""
        end = len(self.text)
        if self.parses:
            # No tag begins before what was sent (a possible start is held back).
            at = self.text.find(_START, self.sent)
            end = at if at >= 0 else end - _overlap(self.text, _START)
        piece = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece

    def answer(self) -> dict[str, Any]:
        """The completion answer the stream made (``choices[0]``: ``text``,
        ``token_ids``, ``logprobs`` in the completion shape, ``finish_reason``,
        ``stop_reason``, ``weight_versions``; ``usage``, ``model``)."""
        logprobs = {"tokens": self.tokens, "token_logprobs": self.lps, "top_logprobs": self.tops}
        choice = {
            "index": 0, "text": self.text, "token_ids": self.ids, "logprobs": logprobs,
            "finish_reason": self.choice.get("finish_reason"),
            "stop_reason": self.choice.get("stop_reason"),
            "weight_versions": self.choice.get("weight_versions"),
        }  # fmt: skip
        return {"model": self.head["model"], "choices": [choice], "usage": self.usage}
