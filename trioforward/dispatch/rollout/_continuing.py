"""What every continuation path shares (docs/operations.md, "Continue after an
abort pause"): the aborted pieces of one answer continued at once, the first
dispatch error ending the others, and the bound on continuations per piece.

A *piece* is one aborted choice or sequence: anything with a ``continuations``
count (int, continuations made so far).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from trioforward import Phase
from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._request import Request
from trioforward.errors import ContinuationLimit, DispatchAborted, TrioforwardError, UpstreamBroken

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

T = TypeVar("T")


async def continue_each(
    items: Iterable[T], one: Callable[[T, list[Reply]], Awaitable[None]]
) -> Reply | None:
    """Run ``one(item, failure)`` for every item at once.

    Returns the first refusal ``one`` put in ``failure`` (the caller answers
    with it), or None when every item ended. Raises the first
    :class:`TrioforwardError` an item raised, after cancelling the others."""
    failure: list[Reply] = []
    errors: list[TrioforwardError] = []

    async def run(item: T) -> None:
        try:
            await one(item, failure)
        except TrioforwardError as exc:
            errors.append(exc)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for item in items:
            nursery.start_soon(run, item)
    if errors:
        raise errors[0]
    return failure[0] if failure else None


def count_continuation(dispatcher: Dispatcher, req: Request, piece: Any) -> None:
    """Count one more continuation of ``piece`` (its ``continuations`` and the
    dispatcher's total). Raises :class:`ContinuationLimit` (stamped with ``req``'s
    attempts; phase ``queued``: the continuation it refuses is never dispatched)
    when it has had ``max_continuations`` already."""
    limit = dispatcher.settings.max_continuations
    if piece.continuations >= limit:
        raise req.stamp(
            ContinuationLimit(
                f"aborted by a pause after {limit} continuations (max_continuations):"
                " not continued again",
                phase=Phase.QUEUED,
            )
        )
    piece.continuations += 1
    dispatcher.continued.continuations += 1


async def send_continuation(
    dispatcher: Dispatcher, req: Request, sub: Request, piece: Any
) -> Reply | None:
    """Dispatch ``sub``, one continuation of ``piece`` for the caller's ``req``
    (in a trace span of its own when ``req`` is traced: docs/operations.md,
    "End-to-end traces"), its attempts and times counted in ``req``.

    Returns its answer, whatever its status, or None when a pause ended it
    before any token came back and it is to be sent again. Raises
    :class:`DispatchAborted` / :class:`UpstreamBroken` when it is not."""
    try:
        if req.trace is None:
            answer = await dispatcher.request(sub)
        else:
            answer = await req.trace.continuation(
                sub, piece.continuations, len(piece.tokens), dispatcher.request(sub)
            )
    except (DispatchAborted, UpstreamBroken):
        absorb(req, sub)
        if not sub.replay:
            raise
        return None
    absorb(req, sub)
    return answer


def absorb(req: Request, sub: Request) -> None:
    """Count a continuation's attempts, times and retries in the caller's request."""
    req.attempts += sub.attempts
    req.queue_time += sub.queue_time
    req.engine_time += sub.engine_time
    if sub.retries:
        req.retries = [*(req.retries or ()), *sub.retries]
