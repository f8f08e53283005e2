"""Requests an engine pause ended, run again: whole, or continued (docs/operations.md).

:func:`replaying_request` and :func:`replaying_stream` wrap the dispatcher for
:class:`~trioforward.dispatch.Client`; what a pause marks on a request
(``req.replay``) is set by :mod:`._weights`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from trioforward._background import open_background_nursery
from trioforward.dispatch.attempts._dispatch import Dispatcher
from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._events import ABORTS, CHAT, COMPLETIONS
from trioforward.dispatch.dialects._routes import CONTINUED, VLLM, token_strings
from trioforward.dispatch.rollout._assembled import (
    assembled,
    assembles,
    ids_asked,
    migrated_answer,
    migrated_tokens,
)
from trioforward.dispatch.rollout._continue import CONTINUE, hide_token_ids, spanned, with_span
from trioforward.dispatch.rollout._continue_tokens import aborted_tokens, continued_tokens
from trioforward.dispatch.rollout._continue_whole import continued_answer
from trioforward.dispatch.rollout._migration import BROKEN, ENGINE_ABORT
from trioforward.errors import DispatchAborted, UpstreamBroken

__all__ = ["is_abort_answer", "replaying_request", "replaying_stream"]


def is_abort_answer(content: bytes) -> bool:
    """True if a body ends a choice with ``finish_reason: "abort"`` (:data:`ABORTS`)."""
    return any(a in content for a in ABORTS)


async def replaying_request(dispatcher: Dispatcher, req: Request) -> Reply:
    """``dispatcher.request(req)``, run again when an engine pause ended it and
    asked for a replay (``req.replay``): whole, or continued from its tokens so
    far (``"continue"``, :mod:`._continue`; whole when it cannot be). A
    ``finish_reason: "abort"`` answer of such a request is never handed out
    (DispatchAborted without replay)."""
    with dispatcher.admission(req):  # every replay and continuation: this one request
        return await _replaying(dispatcher, req)


async def _replaying(dispatcher: Dispatcher, req: Request) -> Reply:
    crossed = False  # replayed whole after a continue pause: the answer gets its span
    while True:
        broken = None  # the error that broke an assembled answer off (_assembled.py)
        try:
            if assembles(dispatcher, req):
                reply, broken = await assembled(dispatcher, req)
            else:
                reply = await dispatcher.request(req)
        except (DispatchAborted, UpstreamBroken):
            if not req.replay or req.aborted_by_call:
                raise
        else:
            if broken is not None or _engine_abort(dispatcher, req, reply):
                # Its engine failed it mid-answer: on elsewhere (_migration.py), or
                # the error / the engine's answer as before.
                if hasattr(req.render, "parse"):  # token-level: read by its dialect
                    moved = await migrated_tokens(dispatcher, req, reply)
                else:
                    moved = await migrated_answer(
                        dispatcher, req, reply, ENGINE_ABORT if broken is None else BROKEN
                    )
                if moved is not None:
                    return moved
                if broken is not None:
                    raise broken
            # Aborted by an abort call (_abort.py): the engine's abort answer is
            # the caller's, never replayed or continued.
            if req.replay is None or req.aborted_by_call:
                return _shown(req, reply, crossed, dispatcher.weight_version)
            # A token-level request is read by its engine's dialect (_continue_tokens).
            token_level = hasattr(req.render, "parse")  # a Rendering, not a route's own
            tokens = aborted_tokens(req, reply) if token_level else None
            if tokens is None and (token_level or not is_abort_answer(reply.content)):
                if req.replay == CONTINUE and req.weight_version != dispatcher.weight_version:
                    # A continue pause did not end it and it answered after the
                    # resume: the engine held it through its pause (vLLM 0.32: it
                    # reached the engine after the pause) and ran it after the
                    # resume, whole, on the new weights (a fleet member does not close
                    # such a request; docs/operations.md, "Fleet mode").
                    req.weight_version = dispatcher.weight_version
                return _shown(req, reply, crossed, dispatcher.weight_version)
            if not req.replay:
                raise req.stamp(req.aborted()) from None
            if req.replay == CONTINUE:
                joined = None
                if tokens is not None:
                    joined = await continued_tokens(dispatcher, req, reply, tokens)
                elif req.url_path in CONTINUED:
                    joined = await continued_answer(dispatcher, req, reply)
                if joined is not None:
                    return joined
        crossed = crossed or req.replay == CONTINUE
        if req.trace is not None:
            req.trace.replay(req.abort_reason)
        req.rearm()


def _engine_abort(dispatcher: Dispatcher, req: Request, reply: Reply) -> bool:
    """``reply`` is an abort answer the engine gave on its own (no pause of the
    gateway, no abort call asked for it) to a token-level request or a
    ``/v1/completions`` request whose token ids the gateway reads, and migration
    is on."""
    return (
        req.replay is None
        and not req.aborted_by_call
        and (hasattr(req.render, "parse") or (req.url_path == COMPLETIONS and ids_asked(req)))
        and dispatcher.settings.max_migrations > 0
        and is_abort_answer(reply.content)
    )


def _shown(req: Request, reply: Reply, crossed: bool, current: str | None) -> Reply:
    """``reply`` as its caller asked for it: without the token ids the gateway asked
    for; with its ``weight_versions`` span if it ``crossed`` a continue pause, or,
    with the token ids the caller asked for, made under one recorded version
    (``current`` still the one it was dispatched under; an answer a keep pause
    spanned names both in ``X-Weight-Version`` only: where the update fell is not known)."""
    if 200 <= reply.status < 300 and req.url_path == CHAT:
        if req.asked_ids:
            reply.content = hide_token_ids(reply.content)
    elif 200 <= reply.status < 300 and req.url_path == VLLM and req.token_strings:
        reply.content = token_strings(reply.content, False)
    elif 200 <= reply.status < 300 and req.url_path == COMPLETIONS:
        if crossed and req.render is None:
            reply.content = spanned(reply.content, req.weight_version, not req.asked_ids)
        elif req.asked_ids:
            reply.content = hide_token_ids(reply.content)
        elif req.render is None and current is not None and req.weight_version == current:
            reply.content = with_span(reply.content, current)
    return reply


@asynccontextmanager
async def replaying_stream(dispatcher: Dispatcher, req: Request) -> AsyncIterator[Reply]:
    """``dispatcher.stream(req)``, run again when an engine pause ended it before its
    head went to the caller (after that it is never replayed: DispatchAborted)."""
    req.streaming = True
    with dispatcher.admission(req):  # every replay and continuation: this one request
        async with _replaying_stream(dispatcher, req) as reply:
            yield reply


@asynccontextmanager
async def _replaying_stream(dispatcher: Dispatcher, req: Request) -> AsyncIterator[Reply]:
    while True:
        try:
            # The nursery: a continued stream's sub-streams (_continue_stream), ended
            # when the reader leaves; the reader's own error comes out unwrapped.
            async with dispatcher.stream(req) as reply, open_background_nursery() as tasks:
                req.handed_over = True
                req.tasks = tasks
                try:
                    yield reply
                finally:
                    req.tasks = None
                return
        except DispatchAborted:
            if not req.replay or req.handed_over or req.aborted_by_call:
                raise
        if req.trace is not None:
            req.trace.replay(req.abort_reason)
        req.rearm()
