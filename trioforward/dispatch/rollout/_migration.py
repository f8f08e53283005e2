"""Migration: a generation whose engine failed mid-answer goes on on another engine.

docs/operations.md, "Migration". An engine that fails after it started a
generation — the connection reset or closed mid-answer, or an abort answer
that no pause of the gateway and no abort call asked for — ends that piece
early, at the tokens the gateway has of it. :func:`migrating` decides whether
it goes on; if so, the continuation is the one an abort pause with
``replay="continue"`` makes (:mod:`._continuing` for whole answers,
:mod:`._continue_stream` for streams): prompt + tokens so far, the budget
left, ``weight_versions`` spans, on an engine other than the ones that failed
it (:func:`avoiding`, read by :func:`~._continue.derived`).

Bounds: ``max_migrations`` per request (0: never, the caller gets the 502
``upstream_broken`` of before); only on the weight version the piece was
made under (the gateway's version has not moved since); only a piece with
tokens — one that has none goes again only where the retry rules prove the
engine never ran it (docs/dispatch.md, "Retries"); never an answer an abort
call ended. Counted in ``Dispatcher.continued.migrations`` by (route,
reason): ``trioforward_migrations_total`` on ``/metrics``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.engines._engines import Engine
from trioforward.errors import UpstreamBroken

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["BROKEN", "ENGINE_ABORT", "migrating", "avoiding", "cut_streams", "until_broken"]

log = logging.getLogger("trioforward.dispatch")

#: Reasons (the ``reason`` label): the engine's connection broke mid-answer
#: (reset, closed, or broken before any answer byte on a connection that had one);
#: the engine ended it with ``finish_reason: "abort"`` of its own.
BROKEN = "broken"
ENGINE_ABORT = "engine_abort"


def migrating(
    dispatcher: Dispatcher,
    req: Request,
    engine: str | None,
    version: str | None,
    tokens: int,
    reason: str,
) -> bool:
    """Whether the caller's ``req``, whose piece of ``tokens`` tokens (made under
    weight ``version``) ``engine`` (URL) failed for ``reason``, goes on on another
    engine. True: counted (``req.migrations``, ``continued.migrations``), ``engine``
    shunned by every later continuation of ``req``, logged and traced. False,
    with nothing counted: ``max_migrations`` reached, no token to go on from, an
    abort call ended it, the gateway's weight version moved since ``version``, or
    no engine but the failed ones could take it."""
    if tokens <= 0 or engine is None or req.aborted_by_call:
        return False
    if req.migrations >= dispatcher.settings.max_migrations:
        return False
    if version != dispatcher.weight_version:
        return False  # the request's policy allows no other weights (yet)
    shunned = (*req.shunned, engine)
    if not any(_takes(e, shunned, req.only) for e in dispatcher.registry.engines):
        return False
    req.migrations += 1
    req.shunned = shunned
    dispatcher.continued.migrations[(req.url_path, reason)] += 1
    log.info(
        "request %s: engine %s failed it (%s) after %d tokens: migrating (%d of max_migrations %d)",
        req.request_id,
        engine,
        reason,
        tokens,
        req.migrations,
        dispatcher.settings.max_migrations,
    )
    if req.trace is not None:
        req.trace.migrated(engine, reason, tokens)
    return True


def _takes(
    engine: Engine, shunned: tuple[str, ...], only: Callable[[Engine], bool] | None
) -> bool:
    """``engine`` may take a migrated piece (it may come back from a pause or an
    ejection, so those count; a removed one does not)."""
    return engine.url not in shunned and not engine.removed and (only is None or only(engine))


def avoiding(req: Request) -> Callable[[Engine], bool] | None:
    """The ``only`` of a continuation of ``req``: ``req.only``, and none of the
    engines that failed it (``None`` when neither applies)."""
    only, shunned = req.only, req.shunned
    if not shunned:
        return only
    if only is None:
        return lambda engine: engine.url not in shunned
    return lambda engine: engine.url not in shunned and only(engine)


def cut_streams(engine: Engine) -> int:
    """Cut every stream handed to its caller that runs on ``engine``, which health
    ejected (dead, hung or restarting: its connections may stay open): each read
    ends as if the engine had closed it, and the stream migrates from the tokens
    relayed (an abort call's stream is left to it). Returns how many were cut."""
    count = 0
    for req in list(engine.calls):
        body = req.stream_body
        if body is not None and req.handed_over and not req.aborted_by_call:
            body.cut()
            count += 1
    if count:
        log.info("engine %s ejected: %d stream(s) on it cut to migrate", engine.url, count)
    return count


async def until_broken(
    source: AsyncIterator[bytes], broken: list[UpstreamBroken]
) -> AsyncIterator[bytes]:
    """``source``'s chunks until its end, or until its engine broke it off (the
    error goes in ``broken``: the tokens relayed so far may migrate)."""
    try:
        async for chunk in source:
            yield chunk
    except UpstreamBroken as exc:
        broken.append(exc)
