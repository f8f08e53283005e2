"""A continued ``/v1/completions`` stream's continuations, streamed (docs/operations.md,
"Continue after an abort pause"): each aborted choice is sent again as a stream
of its own (prompt ids + tokens so far, ``n: 1``, the budget left) and its
events are relayed as they come, token by token: ``index`` kept, the stream's
``id``/``created``/``model``, ``text_offset`` carried on, ``weight_versions``
on each choice's last event; a further abort pause's events are held back and
the choice goes on from the tokens relayed so far. The SSE helpers of
:mod:`._continue_stream` are here too.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson
import trio

from trioforward import Phase
from trioforward.dispatch.attempts._outcome import Reply, gateway_error
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._events import COMPLETIONS, Events
from trioforward.dispatch.rollout._continue import (
    Generation,
    continuation_body,
    derived,
    is_length_refusal,
)
from trioforward.dispatch.rollout._continuing import absorb, count_continuation
from trioforward.dispatch.rollout._migration import BROKEN, ENGINE_ABORT, migrating
from trioforward.errors import DispatchAborted, TrioforwardError, UpstreamBroken
from trioforward.http import PoolError

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["continue_all", "sent", "events_end", "split", "payload"]

_BOUNDARY = re.compile(rb"\r?\n\r?\n")


def events_end(data: bytes) -> int:
    """Length of the complete SSE events at the start of ``data`` (up to the last
    blank line; WHATWG HTML, event stream parsing)."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def split(block: bytes) -> list[bytes]:
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


def sent(gen: Generation) -> tuple[int, int, int]:
    lps = len(gen.logprobs["tokens"]) if gen.logprobs is not None else 0
    return (len(gen.tokens), len(gen.text), lps)


async def continue_all(
    dispatcher: Dispatcher,
    req: Request,
    shape: Events,
    aborted: dict[int, Generation],
    budget: int,
    head: dict[str, Any],
    send: trio.MemorySendChannel[Any],
) -> None:
    """Continue each aborted choice as a ``/v1/completions`` stream of its own, their
    events written in the caller's ``shape`` into ``send``; the first dispatch
    error ends the others and goes into ``send``."""
    errors: list[TrioforwardError] = []

    async def one(index: int, gen: Generation) -> None:
        try:
            await _stream_choice(dispatcher, req, shape, gen, budget, index, head, send)
        except TrioforwardError as exc:
            errors.append(exc)
            nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            nursery.cancel_scope.cancel()  # the reader left

    async with send:
        async with trio.open_nursery() as nursery:
            for index, gen in sorted(aborted.items()):
                nursery.start_soon(one, index, gen)
        if errors:
            try:
                await send.send(errors[0])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


async def _stream_choice(
    dispatcher: Dispatcher,
    req: Request,
    shape: Events,
    gen: Generation,
    budget: int,
    index: int,
    head: dict[str, Any],
    send: trio.MemorySendChannel[Any],
) -> None:
    """Send ``gen`` again as a stream until it ends other than by an abort pause,
    relaying its events to ``send`` as they come (``index`` kept, ``text_offset``
    carried on, ``weight_versions`` on its last event)."""
    counts = dispatcher.continued
    ids = not req.asked_ids
    while True:
        left = budget - len(gen.tokens)
        if left <= 0:
            gen.end("length")
            await send.send(shape.event(head, gen.tail(ids), index))
            return
        count_continuation(dispatcher, req, gen)
        content = continuation_body(shape.fields(), gen, left, stream=True)
        sub = derived(req, content, COMPLETIONS)
        sub.streaming = True
        before = len(gen.tokens)
        try:
            async with dispatcher.stream(sub) as answer:
                if answer.body is None:  # refused: its whole body is read
                    status, content, engine = answer.status, answer.content, answer.engine.url
                else:
                    status = 0
                    await _relay(answer, sub, gen, index, head, ids, send, shape)
        except (DispatchAborted, UpstreamBroken) as exc:
            absorb(req, sub)
            if not sub.replay and not (
                isinstance(exc, UpstreamBroken)
                and migrating(dispatcher, req, exc.engine, sub.weight_version, len(gen.tokens), BROKEN)
            ):
                raise
            continue  # ended by a pause or its engine's failure: on from the tokens relayed so far
        absorb(req, sub)
        if status:
            if is_length_refusal(status, content):
                gen.end("length")  # prompt + tokens so far no longer fit the model
                await send.send(shape.event(head, gen.tail(ids), index))
                return
            text = content[:300].decode("utf-8", "replace")
            raise req.stamp(
                DispatchAborted(
                    f"the continuation after an abort pause failed: engine {engine} answered"
                    f" {status}: {text}",
                    phase=req.phase,
                )
            )
        if gen.finish != "abort":
            return
        if sub.replay is False:
            raise req.stamp(sub.aborted())  # a pause without replay ended it
        if sub.replay is None:  # an abort of another cause: it ends so, or migrates
            failed = sub.engine_url
            if migrating(dispatcher, req, failed, sub.weight_version, len(gen.tokens), ENGINE_ABORT):
                gen.finish = None
                continue
            await send.send(shape.event(head, gen.tail(ids), index))
            return
        counts.tokens_kept += len(gen.tokens) - before


async def _relay(
    answer: Reply,
    sub: Request,
    gen: Generation,
    index: int,
    head: dict[str, Any],
    ids: bool,
    send: trio.MemorySendChannel[Any],
    shape: Events,
) -> None:
    """Relay one continuation stream's events (its abort events held back)."""
    assert answer.body is not None
    base = len(gen.text)  # the continuation's text_offset counts from its own text
    partial = b""
    try:
        async for chunk in answer.body.aiter_bytes():
            data = partial + chunk if partial else chunk
            end = events_end(data)
            partial = data[end:]
            for event in split(data[:end]):
                doc = payload(event)
                if not isinstance(doc, dict):
                    continue
                for choice in doc.get("choices") or []:
                    if not isinstance(choice.get("token_ids"), list):
                        if choice.get("finish_reason") == "abort" and not choice.get("text"):
                            choice = {**choice, "token_ids": []}
                        else:
                            raise sub.stamp(
                                DispatchAborted(
                                    "the continuation's events carry no token ids", phase=sub.phase
                                )
                            )
                    block = choice.get("logprobs")
                    if isinstance(block, dict) and block.get("text_offset"):
                        block = {**block, "text_offset": [o + base for o in block["text_offset"]]}
                        choice = {**choice, "logprobs": block}
                    gen.add(choice, sub.weight_version, shift=False)
                    if gen.finish == "abort" and gen.sent == sent(gen):
                        continue  # nothing new: held back, the next segment goes on
                    out = gen.tail(ids)
                    if gen.finish in (None, "abort"):  # goes on
                        out["finish_reason"] = out["stop_reason"] = None
                        del out["weight_versions"]  # on the last event only
                    gen.mark()
                    await send.send(shape.event(head, out, index))
    except PoolError as exc:
        sub.phase = Phase.READ_BODY
        raise sub.stamp(
            gateway_error(exc, answer.engine.url, answer.deadline, trio.current_time())
        ) from exc
