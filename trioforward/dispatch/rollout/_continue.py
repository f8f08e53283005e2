"""Continue, don't replay: a completion an abort pause ended resumes from its tokens so far.

With ``pause(engine_mode="abort", replay="continue")`` (docs/operations.md,
"Continue after an abort pause") a ``/v1/completions`` answer that an engine
pause ended (``finish_reason: "abort"``, 200, the tokens so far as vLLM 0.32 and
SGLang send them) is not handed out and not re-run whole: each aborted choice
is sent again, on its own (``n: 1``), as its prompt token ids + the tokens it
generated, with the caller's sampling parameters and the budget left, once the
engines resume. The segments are joined (:class:`Generation`) into the one
answer the caller asked for, with per-choice ``weight_versions`` spans
``[{"version", "start", "end"}]`` over output positions, ``end`` exclusive (the
shape of vLLM 0.32's ``WeightVersionSpan`` and SGLang's ``meta_info``).

The gateway asks the engine for token ids (``return_token_ids``) when a
``/v1/completions`` caller did not (:func:`ask_token_ids`), and takes them out
of the answer again (:func:`hide_token_ids`): the caller gets the shape it
asked for. Whole answers are continued in :mod:`._continue_whole`, streams in
:mod:`._continue_stream`, both through the one loop of :mod:`._continuing`.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from trioforward.codec import UNVERSIONED, span_version
from trioforward.dispatch.attempts._counts import ContinueCounts
from trioforward.dispatch.attempts._identity import with_rid
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._events import DEFAULT_MAX_TOKENS
from trioforward.dispatch.dialects._routes import SGLANG
from trioforward.dispatch.rollout._migration import avoiding

__all__ = [
    "CONTINUE",
    "WHOLE",
    "DEFAULT_MAX_TOKENS",
    "replay_mode",
    "ask_token_ids",
    "hide_token_ids",
    "Generation",
    "spanned",
    "with_span",
    "is_length_refusal",
    "warn_no_token_ids",
    "ContinueCounts",
    "derived",
]

log = logging.getLogger("trioforward.dispatch")

CONTINUE = "continue"
WHOLE = "whole"

_ASKED = (b'"return_token_ids":true', b'"return_token_ids": true')
_KEY = b'token_ids":'  # ends both "token_ids": and "prompt_token_ids":


def replay_mode(value: Any) -> str | None:
    """``replay`` of a pause as a mode: ``None`` (no replay), ``"whole"`` (``True``)
    or ``"continue"``. Raises ``ValueError`` for anything else."""
    if value is None or value is False:
        return None
    if value is True or value == WHOLE:
        return WHOLE
    if value == CONTINUE:
        return CONTINUE
    raise ValueError(f"'replay' must be true, false, \"whole\" or \"continue\", got {value!r}")


def ask_token_ids(content: bytes) -> bytes | None:
    """``content`` (a JSON object) with ``"return_token_ids": true`` added last (it
    wins over an earlier key), or ``None`` when the caller asked for them itself or
    the body is not a JSON object."""
    if any(asked in content for asked in _ASKED):
        return None
    body = content.rstrip()
    if not body.startswith(b"{") or not body.endswith(b"}"):
        return None
    inner = body[:-1].rstrip()
    sep = b"" if inner.endswith(b"{") else b","
    return inner + sep + b'"return_token_ids":true}'


def hide_token_ids(data: bytes) -> bytes:
    """An answer (or SSE chunks) with the token-id lists the gateway asked for set
    back to ``null`` (``token_ids``, ``prompt_token_ids``), as the engine answers a
    caller that did not ask. A scan for the keys, not a regex: ~100 times cheaper
    on a 512-token answer with logprobs."""
    find = data.find
    i = find(_KEY)
    if i < 0:
        return data
    out = []
    pos = 0
    size = len(data)
    while i >= 0:
        j = i + len(_KEY)
        k = j
        while k < size and data[k] == 32:  # spaces after the colon
            k += 1
        if k < size and data[k] == 91:  # "["
            end = find(b"]", k)
            if end < 0:
                break
            out.append(data[pos:j])
            out.append(b"null")
            pos = end + 1
        i = find(_KEY, j)
    out.append(data[pos:])
    return b"".join(out)


def warn_no_token_ids(counts: ContinueCounts, engine: str) -> None:
    """Log once per engine (per client) that its abort answers carry no token ids."""
    if engine not in counts.warned:
        counts.warned.add(engine)
        log.warning(
            "engine %s answered an aborted request without token_ids: it cannot be"
            " continued and is replayed whole (logged once per engine)",
            engine,
        )


def is_length_refusal(status: int, content: bytes) -> bool:
    """An engine's 400 for a prompt over the model length (vLLM: "maximum context
    length", SGLang: "context length"): a continuation that no longer fits."""
    return status == 400 and b"context length" in content


_LOGPROBS = ("text_offset", "token_logprobs", "tokens", "top_logprobs")


class Generation:
    """One choice's segments: tokens, logprobs, text and weight-version spans so far.

    ``prompt``: its prompt token ids; ``choice``: the first segment (kept for the
    fields a continuation does not change); ``last``: the last segment;
    ``tokens``: every generated id; ``logprobs``: the per-token lists of the
    segments' ``logprobs`` blocks joined (the completion keys, or the block's
    own); ``continuations``: how many times it was sent again; ``index``: its
    position in the caller's answer.
    """

    __slots__ = (
        "prompt", "choice", "last", "tokens", "logprobs", "text", "spans", "finish", "stop",
        "continuations", "sent", "index",
    )  # fmt: skip

    def __init__(
        self, choice: dict[str, Any], prompt: list[int], version: str | None, index: int = 0
    ) -> None:
        self.prompt = prompt
        self.choice = self.last = choice
        self.index = index
        self.tokens: list[int] = []
        block = choice.get("logprobs")
        self.logprobs: dict[str, list[Any]] | None = (
            {k: [] for k in (block or _LOGPROBS)} if isinstance(block, dict) else None
        )
        self.text = ""
        self.spans: list[dict[str, Any]] = []
        self.finish: Any = None
        self.stop: Any = None
        self.continuations = 0
        self.sent = (0, 0, 0)  # tokens, text, logprob entries a stream's caller has
        self.add(choice, version)

    def add(self, choice: dict[str, Any], version: str | None, base: int | None = None) -> None:
        """Append one segment (a choice with ``token_ids``) made under ``version``;
        its ``text_offset`` counts from ``base`` characters of the text (default:
        the text so far, a whole continuation's; a stream's deltas count from
        their stream's start)."""
        ids = choice.get("token_ids") or []
        start = len(self.tokens)
        version = span_version(version)
        if ids:
            if self.spans and self.spans[-1]["version"] == version:
                self.spans[-1]["end"] = start + len(ids)
            else:
                self.spans.append({"version": version, "start": start, "end": start + len(ids)})
        self.tokens.extend(ids)
        block = choice.get("logprobs")
        if self.logprobs is not None and isinstance(block, dict):
            by = len(self.text) if base is None else base
            for key, values in self.logprobs.items():
                got = block.get(key) or []
                values.extend([o + by for o in got] if by and key == "text_offset" else got)
        self.text += choice.get("text") or ""
        self.finish = choice.get("finish_reason")
        self.stop = choice.get("stop_reason")
        self.last = choice

    def position(self) -> tuple[int, int, int]:
        """Tokens, text and logprob entries so far."""
        lists = self.logprobs
        return (len(self.tokens), len(self.text), max(map(len, lists.values())) if lists else 0)

    def mark(self) -> None:
        """Record what a stream's caller has received so far (:meth:`tail`)."""
        self.sent = self.position()

    def tail(self, ids: bool) -> dict[str, Any]:
        """One stream event's choice with everything after :meth:`mark`: the new
        tokens, text and logprobs, the last finish, and the spans of the whole."""
        tokens, text, lps = self.sent
        out: dict[str, Any] = {"index": self.index, "text": self.text[text:]}
        out["logprobs"] = (
            None
            if self.logprobs is None
            else {k: v[lps:] for k, v in self.logprobs.items()}
        )
        out["finish_reason"] = self.finish
        out["stop_reason"] = self.stop
        out["prompt_token_ids"] = None
        out["token_ids"] = self.tokens[tokens:] if ids else None
        out["weight_versions"] = self.versions()
        return out

    def versions(self) -> list[dict[str, Any]]:
        """The ``weight_versions`` spans (one empty span when no token was generated)."""
        return self.spans or [{"version": UNVERSIONED, "start": 0, "end": 0}]

    def end(self, finish: str) -> None:
        """End here with ``finish`` (a continuation the engine refused: ``"length"``)."""
        self.finish, self.stop = finish, None

    def rendered(self, index: int, ids: bool) -> dict[str, Any]:
        """The joined choice dict (``ids``: keep ``token_ids``/``prompt_token_ids``)."""
        out = dict(self.choice)
        out["index"] = index
        out["text"] = self.text
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        out["finish_reason"] = self.finish
        out["stop_reason"] = self.stop
        out["token_ids"] = self.tokens if ids else None
        if "prompt_token_ids" in out and not ids:
            out["prompt_token_ids"] = None
        out["weight_versions"] = self.versions()
        return out


_IDS_KEY = b'"token_ids":'  # not "prompt_token_ids": (the quote before)


def with_span(content: bytes, version: str) -> bytes:
    """A completion answer with one ``weight_versions`` span per choice, ``0..len(token_ids)``
    under ``version``, inserted right after each choice's ``token_ids`` list: the
    rest of the engine's bytes untouched (an answer that never crossed an update;
    docs/operations.md, "Weight versions"). Unchanged when the engine labelled it
    itself or a choice has no token-id list."""
    if b'"weight_versions"' in content:
        return content
    find = content.find
    i = find(_IDS_KEY)
    if i < 0:
        return content
    label = orjson.dumps(version)
    out = []
    pos = 0
    while i >= 0:
        k = i + len(_IDS_KEY)
        while k < len(content) and content[k] == 32:
            k += 1
        if k >= len(content) or content[k] != 91:  # not a list ("token_ids": null)
            return content
        end = find(b"]", k)
        if end < 0:
            return content
        inner = content[k + 1 : end]
        count = inner.count(b",") + 1 if inner.strip() else 0
        out.append(content[pos : end + 1])
        out.append(b',"weight_versions":[{"version":%b,"start":0,"end":%d}]' % (label, count))
        pos = end + 1
        i = find(_IDS_KEY, pos)
    out.append(content[pos:])
    return b"".join(out)


def spanned(content: bytes, version: str | None, ids: bool) -> bytes:
    """A whole completion answer made under ``version`` with one ``weight_versions``
    span per choice (an answer replayed whole after a continue pause: it crossed an
    update, so it says which weights made it); ``ids``: keep the token-id lists."""
    try:
        doc = orjson.loads(content)
        choices = doc["choices"]
        for choice in choices:
            length = len(choice.get("token_ids") or [])
            choice["weight_versions"] = [{"version": span_version(version), "start": 0, "end": length}]
            if not ids:
                choice["token_ids"] = None
                if "prompt_token_ids" in choice:
                    choice["prompt_token_ids"] = None
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return content
    return orjson.dumps(doc)


def derived(req: Request, content: bytes, path: str | None = None) -> Request:
    """A fresh request carrying one continuation: ``req``'s route (or ``path``),
    headers and routing key and tenant with body ``content``, admitted already (it
    does not count again against ``max_outstanding``, the client's or the tenant's);
    on SGLang's ``/generate``, to the caller's engines with a fresh ``rid`` per attempt."""
    sub = Request(
        req.method,
        path or req.url_path,
        req.headers,
        content,
        req.model,
        req.is_adapter,
        req.session,
        tenant=req.tenant,
    )
    sub.on_dispatch = req.on_dispatch
    # The caller's engines, never back on one that failed it (_migration.py).
    sub.only = avoiding(req)
    if sub.url_path == SGLANG:  # with a fresh rid per attempt
        sub.render = lambda engine, engine_id: (SGLANG, with_rid(content, engine_id))
    sub.accepts = req.accepts  # its weight policy holds for every segment
    sub.origin = req.origin  # whose answer's staleness its version sets
    sub.admitted = True  # the same request: admitted once, under req's admission
    return sub
