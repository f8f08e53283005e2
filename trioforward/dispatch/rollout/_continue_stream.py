"""A ``/v1/completions`` stream an abort pause ended, continued as one unbroken stream.

With ``replay="continue"`` (docs/operations.md, "Continue after an abort pause")
a stream whose head went out is held open through the pause: its events are
relayed as they come until the engine's abort events (``finish_reason:
"abort"``), which are held back with the usage chunk and ``[DONE]``; the
dispatch gives its engine capacity back at once (``reply.release()``), and
after the resume each aborted choice is continued as a stream of its own whose
events are relayed as they come, token by token
(:mod:`._continue_substream`, in the stream's nursery ``req.tasks``), then the
usage chunk (``stream_options.include_usage``, over every token) and ``[DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson
import trio

from trioforward import Phase
from trioforward.dispatch.attempts._outcome import Reply, gateway_error
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._events import COMPLETIONS, Events, events_for
from trioforward.dispatch.rollout._continue import (
    CONTINUE,
    Generation,
    derived,
    hide_token_ids,
    warn_no_token_ids,
)
from trioforward.dispatch.rollout._continue_substream import (
    continue_all,
    events_end,
    payload,
    sent,
    split,
)
from trioforward.dispatch.rollout._continuing import absorb
from trioforward.dispatch.rollout._migration import BROKEN, migrating
from trioforward.dispatch.rollout._stream_spans import StreamSpans
from trioforward.errors import DispatchAborted, TrioforwardError, UpstreamBroken
from trioforward.http import PoolError

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["continuing_events"]

_ABORTS = (b'"finish_reason":"abort"', b'"finish_reason": "abort"')
_DONE = b"data: [DONE]\n\n"


async def continuing_events(
    dispatcher: Dispatcher, req: Request, reply: Reply, source: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """The bytes to relay of stream ``reply`` (raw chunks from ``source``): whole
    events only, token ids hidden when the gateway asked for them, and continued
    past an abort pause with ``replay="continue"``. Raises the dispatch errors of a
    continuation, :class:`DispatchAborted` when it cannot be continued."""
    seen = _Seen(req)  # events relayed: kept, folded into token lists past FOLD_BYTES
    spans = None
    if req.url_path == COMPLETIONS and StreamSpans.wanted(req, dispatcher):
        spans = StreamSpans(req, dispatcher)
    held: list[bytes] = []
    partial = b""
    broken: list[UpstreamBroken] = []  # its engine failed mid-stream (_migration.py)
    async for chunk in _until_broken(source, broken):
        data = partial + chunk if partial else chunk
        end = events_end(data)
        partial = data[end:]
        if not end:
            continue
        block = data[:end]
        if held:
            held.append(block)
            continue
        if req.replay == CONTINUE and any(a in block for a in _ABORTS):
            events = split(block)
            first = next(i for i, e in enumerate(events) if any(a in e for a in _ABORTS))
            block = b"".join(events[:first])
            held.extend(events[first:])
            if not block:
                continue
        seen.add(block)
        seen.relayed = True
        if spans is not None:
            block = spans.block(block)
        yield hide_token_ids(block) if req.asked_ids else block
    if broken and (held or not _cut_short(dispatcher, req, seen, broken[0])):
        raise broken[0]  # no migration: the error as before
    if not held and not seen.cut:
        if partial and not req.aborted_by_call:  # an abort call's cut: dropped
            yield partial  # the engine ended it so: its own
        return
    reply.release()  # the engine ended it: its capacity goes back before the resume
    async for out in _continued(dispatcher, req, reply, seen, held):
        yield out


async def _restarted(dispatcher: Dispatcher, req: Request) -> AsyncIterator[bytes]:
    """``req`` sent again whole, as a stream relayed as it comes (and continued across a
    further pause): an abort pause ended it before any event went to the caller
    and before the engine said its prompt ids (a chat stream still in prefill)."""
    sub = derived(req, req.content)
    sub.streaming, sub.asked_ids, sub.tasks = True, req.asked_ids, req.tasks
    try:
        async with dispatcher.stream(sub) as answer:
            if answer.body is None:  # refused: its whole body is read
                text = answer.content[:300].decode("utf-8", "replace")
                raise sub.stamp(
                    DispatchAborted(
                        f"the replay after an abort pause failed: engine {answer.engine.url}"
                        f" answered {answer.status}: {text}",
                        phase=sub.phase,
                    )
                )
            async for out in continuing_events(dispatcher, sub, answer, _read(sub, answer)):
                yield out
    finally:
        absorb(req, sub)


async def _read(sub: Request, answer: Reply) -> AsyncIterator[bytes]:
    assert answer.body is not None
    try:
        async for chunk in answer.body.aiter_bytes():
            yield chunk
    except PoolError as exc:
        sub.phase = Phase.READ_BODY
        error = gateway_error(exc, answer.engine.url, answer.deadline, trio.current_time())
        raise sub.stamp(error) from exc


async def _continued(
    dispatcher: Dispatcher, req: Request, reply: Reply, seen: _Seen, held: list[bytes]
) -> AsyncIterator[bytes]:
    counts = dispatcher.continued
    shape = seen.shape = seen.shape or events_for(req.url_path, orjson.loads(req.content))
    body = shape.body
    budget = shape.budget()
    if budget is None:
        raise req.stamp(
            DispatchAborted(
                "an abort pause ended this stream and it cannot be continued: a chat"
                " request without max_completion_tokens / max_tokens, or with tools,"
                " response_format or structured outputs",
                phase=req.phase,
            )
        )
    seen.fold()
    if seen.broken:
        warn_no_token_ids(counts, reply.engine.url)
        raise req.stamp(
            DispatchAborted(
                "an abort pause ended this stream and the engine sent no token ids:"
                " it cannot be continued",
                phase=req.phase,
            )
        )
    gens, head, usage = seen.gens, seen.head, seen.usage
    for g in gens.values():
        g.mark()  # what the caller has: the held events' tokens go out from here
    if not _parse(held, gens, head, usage, req, shape):
        seen.broken = True
        warn_no_token_ids(counts, reply.engine.url)
        raise req.stamp(
            DispatchAborted("the engine's abort events carry no token ids", phase=req.phase)
        )
    aborted = {i: g for i, g in gens.items() if g.finish == "abort"}
    for g in aborted.values():
        g.prompt = g.prompt or shape.known_prompt()  # chat: the stream's one prompt
    if not seen.relayed and not any(g.tokens for g in gens.values()):
        if not all(g.prompt for g in aborted.values()):
            counts.whole += 1
            async for event in _restarted(dispatcher, req):
                yield event
            return
    if any(not g.prompt for g in aborted.values()):
        warn_no_token_ids(counts, reply.engine.url)
        raise req.stamp(DispatchAborted("no prompt_token_ids to continue from", phase=req.phase))
    counts.answers += 1
    counts.tokens_kept += sum(len(g.tokens) for g in aborted.values())
    ids = not req.asked_ids
    head = {k: head.get(k) for k in ("id", "object", "created", "model")}
    for index, gen in sorted(gens.items()):
        if gen.finish != "abort" and gen.sent != sent(gen):
            yield shape.event(head, gen.tail(ids), index)  # a choice that ended in the held events
        elif gen.finish == "abort":
            gen.finish = None  # goes on: its held tokens go out with the continuation's first event
    assert req.tasks is not None, "a continued stream is read inside client.stream()"
    send, receive = trio.open_memory_channel[Any](1)
    req.tasks.start_soon(continue_all, dispatcher, req, shape, aborted, budget, head, send)
    async with receive:
        async for item in receive:
            if isinstance(item, TrioforwardError):
                raise item
            yield item
    out = []
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        prompt = int(usage[-1].get("prompt_tokens") or 0) if usage else 0
        completion = sum(len(g.tokens) for g in gens.values())
        use = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }
        out.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": use}) + b"\n\n")
    out.append(_DONE)
    yield b"".join(out)


#: Bytes of relayed events a stream keeps before folding them into token lists
#: (what a continuation needs), so a long stream's memory stays bounded.
FOLD_BYTES = 1 << 20


async def _until_broken(
    source: AsyncIterator[bytes], broken: list[UpstreamBroken]
) -> AsyncIterator[bytes]:
    """``source``'s chunks until its end, or until its engine broke it off (the
    error goes in ``broken``: the tokens relayed so far may migrate)."""
    try:
        async for chunk in source:
            yield chunk
    except UpstreamBroken as exc:
        broken.append(exc)


def _cut_short(dispatcher: Dispatcher, req: Request, seen: _Seen, error: UpstreamBroken) -> bool:
    """Whether a stream whose engine failed with ``error`` migrates: its choices
    relayed so far (every choice of ``n`` had an event, with token ids, and the
    stream can be continued) end here as an abort pause would end them
    (``seen.cut``), counted by :func:`migrating`."""
    try:
        shape = seen.shape = seen.shape or events_for(req.url_path, orjson.loads(req.content))
    except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError):
        return False
    seen.fold()
    gens = seen.gens
    n = shape.body.get("n", 1)
    if seen.broken or shape.budget() is None or len(gens) != (n if isinstance(n, int) else 1):
        return False
    going = [g for g in gens.values() if g.finish is None]
    tokens = sum(len(g.tokens) for g in going)
    if not going or not migrating(dispatcher, req, error.engine, req.weight_version, tokens, BROKEN):
        return False
    for g in going:
        g.finish = "abort"
    seen.cut = True
    return True


class _Seen:
    """The events a stream relayed: raw until :data:`FOLD_BYTES`, then parsed into
    per-choice :class:`Generation` state (``broken``: a chunk had no token ids;
    ``cut``: its engine failed and it migrates)."""

    __slots__ = (
        "req", "blocks", "size", "gens", "head", "usage", "broken", "shape", "relayed", "cut",
    )  # fmt: skip

    def __init__(self, req: Request) -> None:
        self.req = req
        self.blocks: list[bytes] = []
        self.size = 0
        self.gens: dict[int, Generation] = {}
        self.head: dict[str, Any] = {}
        self.usage: list[dict[str, Any]] = []
        self.broken = False
        self.shape: Events | None = None  # the caller's stream shape, read on first use
        self.relayed = False  # an event went to the caller
        self.cut = False  # its engine failed: it migrates (_cut_short)

    def add(self, block: bytes) -> None:
        if self.broken:
            return
        self.blocks.append(block)
        self.size += len(block)
        if self.size > FOLD_BYTES:
            self.fold()

    def fold(self) -> None:
        if self.blocks and not self.broken:
            if self.shape is None:
                self.shape = events_for(self.req.url_path, orjson.loads(self.req.content))
            parsed = _parse(self.blocks, self.gens, self.head, self.usage, self.req, self.shape)
            self.broken = not parsed
        self.blocks, self.size = [], 0


def _parse(
    events: list[bytes],
    gens: dict[int, Generation],
    head: dict[str, Any],
    usage: list[dict[str, Any]],
    req: Request,
    shape: Events,
) -> bool:
    """Add the choices' deltas of ``events`` (in the caller's ``shape``) to ``gens``
    (by choice index); False when a chunk carries no token ids, or one the shape
    cannot continue (the stream cannot be continued)."""
    for event in split(b"".join(events)):
        doc = payload(event)
        if not isinstance(doc, dict):
            continue
        if not head:
            head.update({k: doc.get(k) for k in ("id", "object", "created", "model")})
        if doc.get("usage"):
            usage.append(doc["usage"])
        for raw in doc.get("choices") or []:
            index = raw.get("index", 0)
            prompt = shape.prompt(doc, raw)
            choice = shape.read(raw)
            if choice is None:
                return False
            gen = gens.get(index)
            if gen is None:
                base = shape.base(choice)
                gen = gens[index] = Generation(base, prompt or [], req.weight_version)
            ids = choice.get("token_ids")
            if ids is None and choice.get("finish_reason") == "abort" and not choice.get("text"):
                choice = {**choice, "token_ids": []}  # an abort event that adds nothing
            elif not isinstance(ids, list):
                return False
            gen.add(choice, req.weight_version, shift=False)
    return True
