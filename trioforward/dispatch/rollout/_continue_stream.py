"""A stream an abort pause ended, continued as one unbroken stream, on every route
that streams: ``/v1/completions``, ``/v1/chat/completions``, SGLang ``/generate``
and vLLM ``/inference/v1/generate`` (docs/operations.md, "Continue after an
abort pause").

With ``replay="continue"`` a stream whose head went out is held open through
the pause: its events are relayed as they come until the engine's abort events,
which are held back with what follows; the dispatch gives its engine capacity
back at once (``reply.release()``), and after the resume each aborted choice
goes on through the one continue loop (:func:`~._continuing.continue_piece`)
with a streamed step: sent again as a stream of its own (the OpenAI routes on
``/v1/completions``, the token routes on their own), its events relayed in the
caller's shape as they come, token by token, in the stream's nursery
``req.tasks``; then the caller's closing events (usage, ``[DONE]``). The wire
shapes are the dialects' (:mod:`~trioforward.dispatch.dialects._events`,
:mod:`~trioforward.dispatch.dialects._streams`). :func:`continuing_events` is
the entry.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson
import trio

from trioforward import Phase
from trioforward.dispatch.attempts._outcome import Reply, gateway_error
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._events import (
    ABORTS,
    COMPLETIONS,
    Events,
    events_end,
    payload,
    split,
)
from trioforward.dispatch.dialects._routes import SGLANG, shape_for, token_strings
from trioforward.dispatch.rollout._continue import (
    CONTINUE,
    Generation,
    derived,
    hide_token_ids,
    warn_no_token_ids,
)
from trioforward.dispatch.rollout._continue_whole import Shaped
from trioforward.dispatch.rollout._continuing import absorb, continue_each, continue_piece
from trioforward.dispatch.rollout._migration import BROKEN, migrating, until_broken
from trioforward.dispatch.rollout._stream_spans import StreamSpans
from trioforward.errors import DispatchAborted, TrioforwardError, UpstreamBroken
from trioforward.http import PoolError

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["continuing_events", "FOLD_BYTES"]

_NO_BUDGET = (
    "an abort pause ended this stream and it cannot be continued: a chat request without"
    " max_completion_tokens / max_tokens, or with tools, response_format or structured outputs"
)


async def continuing_events(
    dispatcher: Dispatcher, req: Request, reply: Reply, source: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """The bytes to relay of stream ``reply`` (raw chunks from ``source``): whole
    events only, token ids hidden when the gateway asked for them, and continued
    past an abort pause with ``replay="continue"``. Raises the dispatch errors of a
    continuation, :class:`DispatchAborted` when it cannot be continued (the token
    routes relay the engine's abort events instead: their clients read them)."""
    seen = _Seen(req)  # events relayed: kept, folded into token lists past FOLD_BYTES
    spans = None
    if req.url_path == COMPLETIONS and StreamSpans.wanted(req, dispatcher):
        spans = StreamSpans(req, dispatcher)
    last_only = req.url_path == SGLANG  # each event has every token so far
    held: list[bytes] = []
    partial = b""
    broken: list[UpstreamBroken] = []  # its engine failed mid-stream (_migration.py)
    async for chunk in until_broken(source, broken):
        data = partial + chunk if partial else chunk
        end = events_end(data)
        partial = data[end:]
        if not end:
            continue
        block = data[:end]
        if held:
            held.append(block)
            continue
        if req.replay == CONTINUE and any(a in block for a in ABORTS):
            events = split(block)
            first = next(i for i, e in enumerate(events) if any(a in e for a in ABORTS))
            block = b"".join(events[:first])
            held.extend(events[first:])
            if not block:
                continue
        seen.add(block, last_only)
        seen.relayed = True
        if spans is not None:
            block = spans.block(block)
        if req.token_strings:
            block = token_strings(block, True)
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
    sub.token_strings = req.token_strings
    try:
        async with dispatcher.stream(sub) as answer:
            if answer.body is None:  # refused: its whole body is read
                raise sub.stamp(_failed("the replay", answer, sub))
            async for out in continuing_events(dispatcher, sub, answer, _chunks(sub, answer)):
                yield out
    finally:
        absorb(req, sub)


async def _chunks(sub: Request, answer: Reply) -> AsyncIterator[bytes]:
    """The body of stream ``answer`` as it comes; a broken read raises the
    gateway's error for it, stamped with ``sub``'s attempts."""
    assert answer.body is not None
    try:
        async for chunk in answer.body.aiter_bytes():
            yield chunk
    except PoolError as exc:
        sub.phase = Phase.READ_BODY
        error = gateway_error(exc, answer.engine.url, answer.deadline, trio.current_time())
        raise sub.stamp(error) from exc


def _failed(what: str, answer: Reply, req: Request) -> DispatchAborted:
    text = answer.content[:300].decode("utf-8", "replace")
    return DispatchAborted(
        f"{what} after an abort pause failed: engine {answer.engine.url} answered"
        f" {answer.status}: {text}",
        phase=req.phase,
    )


async def _continued(
    dispatcher: Dispatcher, req: Request, reply: Reply, seen: _Seen, held: list[bytes]
) -> AsyncIterator[bytes]:
    counts = dispatcher.continued
    shape = seen.shaped()
    failed = None if shape.continuable() else _NO_BUDGET
    if failed is None:
        seen.fold()
        for g in seen.gens.values():
            g.mark()  # what the caller has: the held events' tokens go out from here
        if seen.broken:
            failed = "an abort pause ended this stream and the engine sent no token ids: it cannot be continued"
        elif not seen.parse(held):
            seen.broken = True
            failed = "the engine's abort events carry no token ids"
    gens = seen.gens
    aborted = {i: g for i, g in gens.items() if g.finish == "abort"}
    if failed is None:
        for g in aborted.values():
            g.prompt = g.prompt or shape.known_prompt(g.index)  # chat: the stream's one prompt
        if not seen.relayed and not any(g.tokens for g in gens.values()):
            if not all(g.prompt for g in aborted.values()):
                counts.whole += 1
                async for event in _restarted(dispatcher, req):
                    yield event
                return
        if any(not g.prompt for g in aborted.values()):
            failed = "no prompt_token_ids to continue from"
    if failed is not None:
        if failed is not _NO_BUDGET:
            warn_no_token_ids(counts, reply.engine.url)
        if shape.native:
            yield b"".join(held)  # the engine's own abort events: its clients read them
            return
        raise req.stamp(DispatchAborted(failed, phase=req.phase))
    counts.answers += 1
    counts.tokens_kept += sum(len(g.tokens) for g in aborted.values())
    ids, head = not req.asked_ids, seen.head
    for index, gen in sorted(gens.items()):
        if gen.finish != "abort" and gen.sent != gen.position():
            yield shape.event(head, gen, gen.tail(ids), index)  # it ended in the held events
        elif gen.finish == "abort":
            gen.finish = None  # goes on: its held tokens go out with the continuation's first event
    assert req.tasks is not None, "a continued stream is read inside client.stream()"
    send, receive = trio.open_memory_channel[Any](1)
    step = _Streamed(req, shape, head, send)
    req.tasks.start_soon(_continue_all, dispatcher, req, step, list(aborted.values()))
    async with receive:
        async for item in receive:
            if isinstance(item, TrioforwardError):
                raise item
            yield item
    yield shape.closing(head, list(gens.values()), seen.usage)


async def _continue_all(
    dispatcher: Dispatcher, req: Request, step: _Streamed, aborted: list[Generation]
) -> None:
    """Continue every aborted choice at once with ``step`` (its events go into
    ``step.out``); the first dispatch error or refusal ends the others and goes
    into ``step.out``."""
    async with step.out:
        try:
            refused = await continue_each(
                aborted, lambda gen, failure: continue_piece(dispatcher, req, gen, failure, step)
            )
            if refused is not None:
                raise req.stamp(_failed("the continuation", refused, req))
        except TrioforwardError as exc:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await step.out.send(exc)


class _Streamed(Shaped):
    """A stream's choice continued (:class:`~._continuing.Step`): sent as a stream on
    ``shape.path``, its events relayed into ``out`` in the caller's ``shape`` as
    they come (``index`` kept, ``weight_versions`` on its last event), a further
    abort pause's events held back."""

    __slots__ = ("head", "out", "ids")
    stream = True

    def __init__(
        self, req: Request, shape: Events, head: dict[str, Any], out: trio.MemorySendChannel[Any]
    ) -> None:
        super().__init__(req, shape)
        self.head, self.out, self.ids = head, out, not req.asked_ids

    async def end(self, gen: Generation, finish: str | None) -> None:
        if finish is not None:
            gen.end(finish)
        await self.out.send(self.shape.event(self.head, gen, gen.tail(self.ids), gen.index))

    async def send(self, dispatcher: Dispatcher, sub: Request, gen: Generation) -> Reply:
        async with dispatcher.stream(sub) as answer:
            if answer.body is not None:  # else refused: its whole body is read
                await self._relay(answer, sub, gen)
        return answer

    def read(self, answer: Reply, sub: Request) -> Any:
        return ()  # its events were added as they came

    def add(self, gen: Generation, segment: Any, version: str | None) -> bool:
        return bool(gen.finish == "abort")

    async def _relay(self, answer: Reply, sub: Request, gen: Generation) -> None:
        reader, state = self.shape.sub_events(), dict[int, Any]()
        base = len(gen.text)  # the continuation's text_offset counts from its own text
        partial = b""
        async for chunk in _chunks(sub, answer):
            data = partial + chunk if partial else chunk
            end = events_end(data)
            partial = data[end:]
            for event in split(data[:end]):
                doc = payload(event)
                for raw in reader.choices(doc) if isinstance(doc, dict) else ():
                    choice = reader.segment(raw, state)
                    if choice is None:
                        message = "the continuation's events carry no token ids"
                        raise sub.stamp(DispatchAborted(message, phase=sub.phase))
                    gen.add(choice, sub.weight_version, base)
                    if gen.finish == "abort" and gen.sent == gen.position():
                        continue  # nothing new: held back, the next segment goes on
                    out = gen.tail(self.ids)
                    if gen.finish in (None, "abort"):  # goes on
                        out["finish_reason"] = out["stop_reason"] = None
                        del out["weight_versions"]  # on the last event only
                    gen.mark()
                    await self.out.send(self.shape.event(self.head, gen, out, gen.index))


#: Bytes of relayed events a stream keeps before folding them into token lists
#: (what a continuation needs), so a long stream's memory stays bounded.
FOLD_BYTES = 1 << 20


def _cut_short(dispatcher: Dispatcher, req: Request, seen: _Seen, error: UpstreamBroken) -> bool:
    """Whether a stream whose engine failed with ``error`` migrates: its choices
    relayed so far (every choice had an event, with token ids, and the stream
    can be continued) end here as an abort pause would end them (``seen.cut``),
    counted by :func:`~._migration.migrating`."""
    try:
        shape = seen.shaped()
    except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError):
        return False
    seen.fold()
    if seen.broken or not shape.continuable() or len(seen.gens) != shape.count():
        return False
    going = [g for g in seen.gens.values() if g.finish is None]
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
        "req", "blocks", "size", "gens", "head", "usage", "broken", "shape", "relayed", "state",
        "cut",
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
        self.state: dict[int, Any] = {}  # the shape's reading state of this stream
        self.cut = False  # its engine failed: it migrates (_cut_short)

    def shaped(self) -> Events:
        if self.shape is None:
            self.shape = shape_for(self.req.url_path, orjson.loads(self.req.content))
        return self.shape

    def add(self, block: bytes, last_only: bool = False) -> None:
        """Keep relayed ``block``; ``last_only``: it has everything the ones before had."""
        if self.broken:
            return
        if last_only and b'"index"' not in block:
            self.blocks, self.size = [], 0
        self.blocks.append(block)
        self.size += len(block)
        if self.size > FOLD_BYTES:
            self.fold()

    def fold(self) -> None:
        if self.blocks and not self.broken:
            self.broken = not self.parse(self.blocks)
        self.blocks, self.size = [], 0

    def parse(self, events: list[bytes]) -> bool:
        """Add the choices' segments of ``events`` (in the caller's shape) to
        :attr:`gens` by choice index; False when a choice carries no token ids, or
        one the shape cannot continue."""
        shape, version = self.shaped(), self.req.weight_version
        for event in split(b"".join(events)):
            doc = payload(event)
            if not isinstance(doc, dict):
                continue
            if not self.head:
                self.head.update(shape.head(doc))
            if doc.get("usage"):
                self.usage.append(doc["usage"])
            for raw in shape.choices(doc):
                index = raw.get("index", 0) if isinstance(raw, dict) else 0
                prompt = shape.prompt(doc, raw) if isinstance(raw, dict) else None
                choice = shape.segment(raw, self.state)
                if choice is None:
                    return False
                gen = self.gens.get(index)
                if gen is None:
                    base = shape.base(choice)
                    gen = self.gens[index] = Generation(base, prompt or [], version, index)
                gen.add(choice, version, 0)
        return True
