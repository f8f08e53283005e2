"""Tinker's two hot calls, ``asample`` and ``retrieve_future``, as routes of the ASGI front.

A trainer sends two requests per sample, so these carry all of the Tinker load.
The front (:mod:`trioforward.server.front._asgi`) answers them before Quart sees them
and does the request plumbing (API key, body size, JSON, disconnect, errors as
:class:`~trioforward.server.base._errors.RequestError`); this module only translates
the Tinker wire format. Every other Tinker route is a Quart view (``_routes.py``).

A held poll stops holding when the client goes away (the front cancels it); the
sample itself is never touched. Refusals, and polls whose hold ran out (408), are
counted in ``trioforward_tinker_rejections_total`` (docs/server.md, "Metrics (`GET /metrics`)"):
the front counts those it answers, this module and ``_fleet.py`` the rest. A result counts as delivered once Hypercorn
accepted the whole response body.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import orjson

from trioforward.errors import QueueFull
from trioforward.server.base._errors import RequestError, bad_request
from trioforward.server.base._validate import weight_policy
from trioforward.server.front._asgi import Call, Route, respond
from trioforward.server.tinker import _fleet
from trioforward.server.tinker._futures import (
    PENDING,
    Future,
    FutureGone,
    FutureUnknown,
    StoreClosing,
    StoreFull,
)
from trioforward.server.tinker._requests import (
    id_header,
    identify,
    make_sampling_session,
    parse_sample,
)
from trioforward.server.tinker._state import TinkerState, state_of
from trioforward.server.tinker._wire import TRY_AGAIN

__all__ = ["ROUTES", "ASAMPLE", "RETRIEVE"]

ASAMPLE = "/api/v1/asample"
RETRIEVE = "/api/v1/retrieve_future"


def _asample(call: Call) -> Awaitable[None]:
    """``POST /api/v1/asample``: answers the (possibly existing) future for this sample.

    A resubmit of ``(sampling_session_id, seq_id)`` returns the future already
    issued, without parsing the rest of the body. Raises :class:`RequestError`
    (400 bad body, 404 unknown sampling session, 429 too many unfinished futures:
    ``queue_full``, or the caller's tenant's ``max_outstanding``: ``tenant_queue_full``).
    """
    state = state_of(call.state)
    body = call.data
    sampler_id = body.get("sampling_session_id")
    if sampler_id is not None:
        sampling_session = state.sampling_session(str(sampler_id))
        if sampling_session is None:
            raise RequestError(404, f"unknown sampling session {sampler_id!r}", code="not_found")
    else:  # the older stateless form names the model in the request itself
        if not body.get("base_model") and not body.get("model_path"):
            raise bad_request("asample needs sampling_session_id (or base_model or model_path)")
        sampling_session = make_sampling_session(
            "",
            0,
            body.get("base_model") or None,
            body.get("model_path") or None,
            state.adapter_root,
            state.registered_adapters(),
        )
        state.remember(sampling_session)
    seq_id = body.get("seq_id")
    key = (sampling_session.sampler_id, seq_id) if sampler_id is not None and seq_id is not None else None
    future = state.store.lookup_key(key)
    if future is None:
        tenant = call.tenant
        if tenant is not None and tenant.max_outstanding and tenant.samples >= tenant.max_outstanding:
            err = tenant.refusal(tenant.samples, "samples")
            hint = state.client.retry_after_hint(err)
            raise RequestError(429, str(err), code=err.code, retry_after=hint)
        job = parse_sample(body, sampling_session)
        job.tenant = tenant
        job.policy = weight_policy(call.headers)  # a 400 naming the header when malformed
        if state.shared is not None:  # fleet mode: claim (session, seq) fleet-wide
            return _fleet.submit(state, key, job, call)
        try:
            future, created = state.store.submit(key, job.num_samples)
        except StoreFull as err:
            hint = state.client.retry_after_hint(QueueFull(str(err)))
            raise RequestError(
                429, f"gateway queue is full: {err}", code="queue_full", retry_after=hint
            ) from None
        if created:
            identify(job, future.request_id, call)
            state.runner.submit(future, job)
    answer = {"request_id": future.request_id, "sample_sequence_ids": future.sample_sequence_ids}
    call.log.complete = True
    return respond(call.send, 200, orjson.dumps(answer), extra=id_header(future.request_id, call))



def _retrieve(call: Call) -> Awaitable[None]:
    """``POST /api/v1/retrieve_future``: the future's result, held until it is ready.

    Raises :class:`RequestError` (400 when ``request_id`` is not a string, 404
    never issued, 410 no longer held). In fleet mode an id of another member is
    looked up in the shared state (``_fleet.py``).
    """
    state = state_of(call.state)
    request_id: Any = call.data.get("request_id")
    if not isinstance(request_id, str):
        raise bad_request("request_id must be a string", "request_id")
    try:
        future = state.store.get(request_id)
    except FutureUnknown:
        raise RequestError(404, f"future {request_id!r} was never issued", code="not_found") from None
    except FutureGone:
        if state.shared is not None and not state.store.is_own(request_id):
            return _fleet.retrieve(state, request_id, call)  # another member's future
        raise _gone(request_id) from None
    return _deliver(state, future, call)


def _gone(request_id: str) -> RequestError:
    return RequestError(410, f"future {request_id!r} is no longer held; resubmit", code="gone")


def _closing(request_id: str) -> RequestError:
    return RequestError(
        503,
        f"the gateway is shutting down with sample {request_id!r} still running; poll again",
        type="server_error",
        code="shutting_down",
        retry_after=1,
    )


async def _deliver(state: TinkerState, future: Future, call: Call) -> None:
    """Hold a pending ``future`` (408 past the hold; 410 if the drain abandons it
    meanwhile; 503 ``shutting_down`` with ``Retry-After`` once the drain's cutoff
    passed with it still running), then send its stored bytes, with
    ``X-Weight-Version`` when the weights that produced them had a version."""
    if future.state == PENDING:
        try:
            done = await state.store.wait(future.request_id)
        except (FutureGone, StoreClosing) as exc:
            err = _gone(future.request_id) if isinstance(exc, FutureGone) else _closing(future.request_id)
            call.log.status = err.status
            call.refused(err.status, err.code)
            call.log.complete = True
            await respond(call.send, err.status, err.body(), extra=err.headers())
            return
        if done is None:
            call.refused(408, "try_again")
            call.log.complete = True
            await respond(call.send, 408, TRY_AGAIN)
            return
        future = done
    call.log.complete = True
    version = future.weight_version  # the protobuf has no field for it: docs/tinker.md
    extra = () if version is None else ((b"x-weight-version", version.encode()),)
    await respond(call.send, 200, future.body, future.content_type.encode(), extra)
    state.store.mark_delivered(future)


ROUTES = {
    ASAMPLE: Route(_asample, empty_body=True, tinker=True),
    RETRIEVE: Route(_retrieve, empty_body=True, tinker=True),
}
