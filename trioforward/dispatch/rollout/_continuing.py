"""What every continuation path shares (docs/operations.md, "Continue after an
abort pause"): the aborted pieces of one answer continued at once, the first
dispatch error ending the others, and the bound on continuations per piece.

A *piece* is one aborted choice or sequence: anything with a ``continuations``
count (int, continuations made so far).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson
import trio

from trioforward import Phase
from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.rollout._continue import is_length_refusal, warn_no_token_ids
from trioforward.dispatch.rollout._migration import BROKEN, ENGINE_ABORT, migrating
from trioforward.errors import ContinuationLimit, DispatchAborted, TrioforwardError, UpstreamBroken

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

T = TypeVar("T")


class Piece(Protocol):
    """One aborted choice or sequence: its tokens so far and its continuations."""

    tokens: list[int]
    continuations: int


P = TypeVar("P", bound=Piece)
P_in = TypeVar("P_in", bound=Piece, contravariant=True)


class Step(Protocol[P_in]):
    """What the continue loop (:func:`continue_piece`) asks of one route's shape."""

    def left(self, piece: P_in) -> Any:
        """The budget left (an int; anything else: no budget to count down)."""

    async def end(self, piece: P_in, finish: str | None) -> None:
        """``piece`` ends here: with ``finish`` (``"length"``: no budget left, or the
        engine refused a prompt that no longer fits), or (``None``) as an abort of
        another cause left it."""

    def request(self, piece: P_in, left: Any) -> Request:
        """The request continuing ``piece`` with ``left`` tokens to go."""

    async def send(self, dispatcher: Dispatcher, sub: Request, piece: P_in) -> Reply:
        """Dispatch ``sub``; its answer (a stream's relayed to its caller as it comes)."""

    def read(self, answer: Reply, sub: Request) -> Any:
        """The one segment of a 2xx ``answer`` to ``sub``; ``None`` when it carries no
        token ids; raises ``ValueError`` when it cannot be read at all."""

    def add(self, piece: P_in, segment: Any, version: str | None) -> bool:
        """Append ``segment`` (made under ``version``) to ``piece``; True when an abort
        ended it."""


class Whole:
    """A whole answer's step: sent and read whole; ``piece.end(finish)`` ends it."""

    async def send(self, dispatcher: Dispatcher, sub: Request, piece: Any) -> Reply:
        return await dispatcher.request(sub)

    async def end(self, piece: Any, finish: str | None) -> None:
        if finish is not None:
            piece.end(finish)


async def continue_piece(
    dispatcher: Dispatcher, req: Request, piece: P, failure: list[Reply], step: Step[P]
) -> None:
    """Send ``piece`` again until it ends other than by an abort pause: the one
    continue loop of every route, whole answers and streams (``step``: the
    route's shape). A non-2xx answer other than a length refusal, or one ``step``
    cannot read, goes to ``failure``. Raises :class:`DispatchAborted` past
    ``max_continuations`` or when a pause without replay ended a continuation."""
    counts = dispatcher.continued
    while True:
        left = step.left(piece)
        if isinstance(left, int) and left <= 0:
            return await step.end(piece, "length")
        count_continuation(dispatcher, req, piece)
        sub = step.request(piece, left)
        before = len(piece.tokens)
        answer = await send_continuation(dispatcher, req, sub, piece, step)
        if answer is None:
            continue  # ended by a pause before any token came back: send it again
        if is_length_refusal(answer.status, answer.content):
            return await step.end(piece, "length")  # prompt + tokens so far no longer fit
        if not 200 <= answer.status < 300:
            failure.append(answer)
            return
        try:
            segment = step.read(answer, sub)
        except ValueError:
            failure.append(answer)
            return
        if segment is None:
            warn_no_token_ids(counts, answer.engine.url)
            failure.append(answer)
            return
        if not step.add(piece, segment, sub.weight_version):
            return
        if sub.replay is False:
            raise req.stamp(sub.aborted())  # a pause without replay ended it
        if sub.replay is None and not migrating(
            dispatcher, req, answer.engine.url, sub.weight_version, len(piece.tokens), ENGINE_ABORT
        ):
            return await step.end(piece, None)  # an abort answer of another cause: the caller's
        counts.tokens_kept += len(piece.tokens) - before


def loaded(req: Request, reply: Reply) -> tuple[Any, Any] | None:
    """``(body, answer)``: the caller's request body and the engine's answer, parsed;
    ``None`` when either is not JSON (the caller replays it whole)."""
    try:
        return orjson.loads(req.content), orjson.loads(reply.content)
    except orjson.JSONDecodeError:
        return None


async def continue_aborted(
    dispatcher: Dispatcher,
    reply: Reply,
    aborted: list[P],
    one: Callable[[P, list[Reply]], Awaitable[None]],
    joined: Callable[[], bytes],
) -> Reply | None:
    """Continue every ``aborted`` piece of the answer ``reply`` with ``one`` (as
    :func:`continue_each`) and answer ``joined()`` in ``reply``'s envelope; the
    first refusal instead; ``None`` when no piece generated a token yet (a whole
    replay costs the same). Counts ``answers``, ``tokens_kept`` and ``whole``."""
    counts = dispatcher.continued
    if not any(p.tokens for p in aborted):
        counts.whole += 1
        return None
    counts.answers += 1
    counts.tokens_kept += sum(len(p.tokens) for p in aborted)
    refused = await continue_each(aborted, one)
    if refused is not None:
        return refused
    return Reply(reply.engine, reply.status, reply.headers, joined(), None, reply.deadline)


async def continue_each(
    items: Iterable[T], one: Callable[[T, list[Reply]], Awaitable[None]]
) -> Reply | None:
    """Run ``one(item, failure)`` for every item at once.

    Returns the first refusal ``one`` put in ``failure`` (the caller answers
    with it; the other items are cancelled), or None when every item ended.
    Raises the first :class:`TrioforwardError` an item raised, after cancelling
    the others."""
    failure: list[Reply] = []
    errors: list[TrioforwardError] = []

    async def run(item: T) -> None:
        try:
            await one(item, failure)
            if failure:
                nursery.cancel_scope.cancel()  # the answer is that refusal: the rest ends
        except TrioforwardError as exc:
            errors.append(exc)
            nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            nursery.cancel_scope.cancel()  # a stream's reader left

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
    dispatcher: Dispatcher, req: Request, sub: Request, piece: Any, step: Step[Any]
) -> Reply | None:
    """Dispatch ``sub`` with ``step.send``, one continuation of ``piece`` for the
    caller's ``req`` (a whole one in a trace span of its own when ``req`` is traced: docs/operations.md,
    "End-to-end traces"), its attempts and times counted in ``req``.

    Returns its answer, whatever its status, or None when a pause ended it
    before any token came back and it is to be sent again. Raises
    :class:`DispatchAborted` / :class:`UpstreamBroken` when it is not."""
    try:
        if req.trace is None or sub.streaming:
            answer = await step.send(dispatcher, sub, piece)
        else:
            answer = await req.trace.continuation(
                sub, piece.continuations, len(piece.tokens), step.send(dispatcher, sub, piece)
            )
    except (DispatchAborted, UpstreamBroken) as exc:
        absorb(req, sub)
        if sub.replay:
            return None
        if isinstance(exc, UpstreamBroken) and migrating(
            dispatcher, req, exc.engine, sub.weight_version, len(piece.tokens), BROKEN
        ):
            return None  # its engine failed: on from the tokens before it, elsewhere
        raise
    absorb(req, sub)
    return answer


def absorb(req: Request, sub: Request) -> None:
    """Count a continuation's attempts, times and retries in the caller's request."""
    req.attempts += sub.attempts
    req.queue_time += sub.queue_time
    req.engine_time += sub.engine_time
    if sub.retries:
        req.retries = [*(req.retries or ()), *sub.retries]
