"""Tinker's hot calls in fleet mode: the parts that ask the shared state (docs/fleet.md).

The fast path (``_fastpath.py``) answers everything this member can answer
from its own future store; it hands over here only for a sample that is new to
this member (its ``(session, seq)`` is claimed fleet-wide before it runs) and
for a poll of an id this member does not hold (another member's future).
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.server.base._errors import RequestError, error_body
from trioforward.server.front._asgi import Call, respond
from trioforward.server.tinker._futures import StoreFull
from trioforward.server.tinker._requests import SampleJob, id_header, identify
from trioforward.server.tinker._state import TinkerState
from trioforward.server.tinker._wire import TRY_AGAIN

__all__ = ["submit", "retrieve", "RETRY_AFTER"]

# Seconds a 503 (shared state unreachable) asks the client to wait; the SDK
# retries 5xx answers of asample with the same (session, seq).
RETRY_AFTER = b"1"


def _issued(request_id: str, num_samples: int) -> bytes:
    ids = [f"{request_id}.{i}" for i in range(num_samples)]
    return orjson.dumps({"request_id": request_id, "sample_sequence_ids": ids})


async def _answer(
    call: Call,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    call.log.status = status
    call.log.complete = True
    await respond(call.send, status, body, content_type, extra)


async def _refuse(call: Call, err: RequestError) -> None:
    # Errors after the front's start step are answered here: the front only
    # answers RequestErrors raised before the route returned its awaitable.
    call.refused(err.status, err.code)
    await _answer(call, err.status, err.body())


async def _unavailable(call: Call, err: Exception) -> None:
    call.refused(503, "state_unavailable")
    call.log.status = 503
    call.log.complete = True
    body = error_body(f"{err}; retry", type="server_error", code="state_unavailable")
    await respond(call.send, 503, body, extra=((b"retry-after", RETRY_AFTER),))


async def submit(state: TinkerState, key: Any, job: SampleJob, call: Call) -> None:
    """Claim ``key`` (``(sampling session id, seq id)`` or ``None``) fleet-wide and run the
    sample only if this claim won; answer the id either way. ``max_outstanding`` counts
    the unfinished samples of every live member (as of the last heartbeat).
    Answers 429 when the fleet's queue is full, 503 when the shared state is away."""
    from trioforward.fleet import StateUnavailable

    store, fleet = state.store, state.fleet
    limit = store.max_outstanding
    if limit and store.outstanding + fleet.others_outstanding() >= limit:
        message = f"fleet queue is full: {limit} samples outstanding (max_outstanding)"
        await _refuse(call, RequestError(429, message, code="queue_full"))
        return
    request_id = store.reserve_id()
    if key is not None:
        try:
            claimed = await state.shared.claim(key[0], key[1], request_id)
        except StateUnavailable as err:
            await _unavailable(call, err)
            return
        if claimed is not None and not (store.is_own(claimed) and not store.holds(claimed)):
            # A resubmit: issued by another member, or here and still held.
            await _answer(call, 200, _issued(claimed, job.num_samples), extra=id_header(claimed, call))
            return
        if claimed is not None:
            # This member's own claim that it does not hold: a claim Redis ran
            # after our wait for it timed out (that asample answered 503), or a
            # future evicted since. Run it under that id: otherwise every
            # resubmit would be told to poll an id nobody runs.
            request_id = claimed
    try:
        future, created = store.submit(key, job.num_samples, request_id)
    except StoreFull as err:
        await _refuse(call, RequestError(429, f"gateway queue is full: {err}", code="queue_full"))
        return
    if created:
        identify(job, future.request_id, call)
        state.runner.submit(future, job)
    issued = _issued(future.request_id, future.num_samples)
    await _answer(call, 200, issued, extra=id_header(future.request_id, call))


async def retrieve(state: TinkerState, request_id: str, call: Call) -> None:
    """A poll for a future another member issued: its bytes from the shared state,
    waited for up to the poll hold (408 past it); 410 when its result expired or
    its owner left the fleet (the SDK resubmits); 503 when the shared state is away."""
    from trioforward.fleet import FutureExpired, StateUnavailable

    try:
        found = await state.shared.fetch(request_id, state.store.hold)
    except FutureExpired as err:
        await _refuse(call, RequestError(410, f"{err}; resubmit", code="gone"))
        return
    except StateUnavailable as err:
        await _unavailable(call, err)
        return
    if found is None:
        call.refused(408, "try_again")
        await _answer(call, 408, TRY_AGAIN)
        return
    content_type, body = found
    await _answer(call, 200, body, content_type.encode())
