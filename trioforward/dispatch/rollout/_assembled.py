"""A whole ``/v1/completions`` answer asked of the engine as a stream and assembled.

docs/operations.md, "Migration". An engine that fails in the middle of a whole
answer leaves the gateway nothing: the bytes of a JSON body cut short carry no
token it can go on from. With ``assemble_answers`` the gateway asks the engine
for a stream instead (``"stream": true`` with the usage chunk) and assembles
the events into the answer the engine would have sent whole — the same
choices, token ids and logprobs, usage — so that when the stream breaks off,
each unfinished choice ends at the tokens received, ``finish_reason:
"abort"``, and the answer migrates (:mod:`._migration`) through the one
continue loop of whole answers (:func:`~._continue_whole.continued_answer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import trio

from trioforward import Phase
from trioforward.dispatch.attempts._outcome import Reply, gateway_error
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._events import COMPLETIONS, events_end, payload, split
from trioforward.dispatch.rollout._continue import Generation
from trioforward.dispatch.rollout._continue_tokens import aborted_tokens, continued_tokens
from trioforward.dispatch.rollout._continue_whole import continued_answer
from trioforward.dispatch.rollout._migration import ENGINE_ABORT, migrating
from trioforward.errors import UpstreamBroken
from trioforward.http import PoolError

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["ids_asked", "assembles", "assembled", "migrated_answer", "migrated_tokens"]

_HEAD = ("id", "object", "created", "model")
_JSON = (b"content-type", b"application/json")
_ASKED = (b'"return_token_ids":true', b'"return_token_ids": true')


def ids_asked(req: Request) -> bool:
    """``req``'s body asks the engine for token ids (the gateway asked, or its caller)."""
    return req.asked_ids or any(asked in req.content for asked in _ASKED)


def assembles(dispatcher: Dispatcher, req: Request) -> bool:
    """Whether ``req`` is sent as a stream and assembled: ``assemble_answers`` is
    on, migration too, and ``req`` is a route's own ``/v1/completions`` request
    for a whole answer whose token ids the engine sends (:func:`ids_asked`)."""
    settings = dispatcher.settings
    return (
        settings.assemble_answers
        and settings.max_migrations > 0
        and req.render is None
        and req.url_path == COMPLETIONS
        and b'"stream":true' not in req.content
        and b'"stream": true' not in req.content
        and ids_asked(req)
    )


async def assembled(dispatcher: Dispatcher, req: Request) -> tuple[Reply, UpstreamBroken | None]:
    """``req``'s answer, asked as a stream and assembled into the whole answer, and
    the error that broke the stream off (``None``: it ended). A broken answer's
    unfinished choices end with ``finish_reason: "abort"`` at the tokens
    received (an event cut short is dropped). An engine error status comes back
    as the engine sent it. Raises the dispatch errors of
    :meth:`Dispatcher.stream`; :class:`UpstreamBroken` when the body is not the
    stream asked for."""
    body = orjson.loads(req.content)
    caller = req.content
    req.content = orjson.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})
    try:
        async with dispatcher.stream(req) as answer:
            if answer.body is None:
                return answer, None
            chunks: list[bytes] = []
            broken: UpstreamBroken | None = None
            try:
                async for chunk in answer.body.aiter_bytes():
                    chunks.append(chunk)
            except PoolError as exc:
                req.phase = Phase.READ_BODY
                error = gateway_error(exc, answer.engine.url, answer.deadline, trio.current_time())
                if not isinstance(error, UpstreamBroken):
                    raise req.stamp(error) from exc
                broken = req.stamp(error)
    finally:
        req.content = caller
    data = b"".join(chunks)
    content = _whole(data[: events_end(data)], req.weight_version, broken is not None)  # an event cut short: dropped
    if content is None:
        raise broken or req.stamp(
            UpstreamBroken(
                f"engine {answer.engine.url} answered the stream asked for a whole answer"
                " with events the gateway cannot read",
                phase=Phase.READ_BODY,
                engine=answer.engine.url,
            )
        )
    headers = [h for h in answer.headers if h[0] != b"content-type"]
    headers.append(_JSON)
    return Reply(answer.engine, answer.status, headers, content, None, answer.deadline), broken


def _whole(data: bytes, version: str | None, broken: bool) -> bytes | None:
    """The whole answer the completion events ``data`` make (``broken``: their
    unfinished choices end ``"abort"``); ``None`` when an event cannot be read."""
    gens: dict[int, Generation] = {}
    head: dict[str, Any] = {}
    usage: Any = None
    for event in split(data):
        doc = payload(event)
        if not isinstance(doc, dict):
            continue
        if not head:
            head = {k: doc.get(k) for k in _HEAD}
        usage = doc.get("usage") or usage
        for choice in doc.get("choices") or []:
            if not isinstance(choice, dict) or not isinstance(choice.get("token_ids"), list):
                return None
            index = choice.get("index", 0)
            gen = gens.get(index)
            if gen is None:
                prompt = choice.get("prompt_token_ids") or []
                gens[index] = Generation(choice, prompt, version, index)
            else:
                gen.add(choice, version, 0)
    choices = []
    for index, gen in sorted(gens.items()):
        if broken and gen.finish is None:
            gen.finish = "abort"
        out = gen.rendered(index, True)
        del out["weight_versions"]  # as the engine's whole answer: the gateway adds its own
        choices.append(out)
    if usage is None and gens:  # broken off before the usage chunk: counted here
        prompt = len(gens[min(gens)].prompt)
        completion = sum(len(g.tokens) for g in gens.values())
        usage = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }
    try:
        return orjson.dumps({**head, "choices": choices, "usage": usage})
    except TypeError:
        return None



async def migrated_answer(
    dispatcher: Dispatcher, req: Request, reply: Reply, reason: str
) -> Reply | None:
    """``req``'s ``/v1/completions`` answer ``reply``, whose engine ended it early
    for ``reason`` (its unfinished choices ``finish_reason: "abort"``), continued on
    another engine into the whole answer; ``None`` when it does not migrate
    (:func:`~._migration.migrating`; a choice of ``n`` missing). Raises the
    dispatch errors of a continuation."""
    try:
        choices = orjson.loads(reply.content)["choices"]
        n = orjson.loads(req.content).get("n", 1)
        ended = [c for c in choices if c.get("finish_reason") == "abort"]
        tokens = sum(len(c.get("token_ids") or ()) for c in ended)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    if len(choices) != (n if isinstance(n, int) else 1) or not ended:
        return None
    if not migrating(dispatcher, req, reply.engine.url, req.weight_version, tokens, reason):
        return None
    return await continued_answer(dispatcher, req, reply)


async def migrated_tokens(dispatcher: Dispatcher, req: Request, reply: Reply) -> Reply | None:
    """Token-level ``req``'s answer ``reply`` (``client.complete()``, Tinker
    samples), which its engine ended with an abort of its own, continued on
    another engine through the dialect seam; ``None`` when it does not migrate."""
    done = aborted_tokens(req, reply)
    if done is None:
        return None
    tokens = sum(len(c.tokens) for c in done.choices if c.finish_reason == "abort")
    if not migrating(dispatcher, req, reply.engine.url, req.weight_version, tokens, ENGINE_ABORT):
        return None
    return await continued_tokens(dispatcher, req, reply, done)
