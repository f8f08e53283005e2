"""The logic of the two hot Tinker calls, shared by the ASGI fast path and the Quart routes.

Both return encoded answers (status, content type, bytes): no framework types,
so the same code serves ``asample`` and ``retrieve_future`` whichever layer
received the request.
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.server._errors import RequestError
from trioforward.server._validate import parse_body
from trioforward.server.tinker._futures import Future, FutureGone, FutureUnknown, StoreFull
from trioforward.server.tinker._requests import BadRequest, make_sampler, parse_sample
from trioforward.server.tinker._state import TinkerState

__all__ = ["Answer", "error", "parse_json", "asample", "lookup"]

Answer = tuple[int, bytes]  # (status, JSON body)


def error(status: int, message: str, code: str) -> Answer:
    """An OpenAI-style error body (the SDK only reads the status)."""
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return status, orjson.dumps(body)


def parse_json(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object ({} when empty). Raises :class:`BadRequest`."""
    try:
        return parse_body(raw, allow_empty=True)
    except RequestError as err:
        raise BadRequest(err.message) from None


def asample(state: TinkerState, body: dict[str, Any]) -> Answer:
    """``POST /api/v1/asample``: the (possibly existing) future for this sample.

    A resubmit of ``(sampling_session_id, seq_id)`` returns the future already
    issued, without parsing the rest of the body. Raises :class:`BadRequest`.
    """
    sampler_id = body.get("sampling_session_id")
    if sampler_id is not None:
        sampler = state.sampler(str(sampler_id))
        if sampler is None:
            return error(404, f"unknown sampling session {sampler_id!r}", "not_found")
    else:  # the older stateless form names the model in the request itself
        sampler = make_sampler(
            "",
            0,
            body.get("base_model") or None,
            body.get("model_path") or None,
            state.adapter_root,
            state.registered_adapters(),
        )
        state.remember(sampler)
    seq_id = body.get("seq_id")
    key = (sampler.sampler_id, seq_id) if sampler_id is not None and seq_id is not None else None
    future = state.store.lookup_key(key)
    if future is None:
        job = parse_sample(body, sampler)
        try:
            future, created = state.store.submit(key, job.num_samples)
        except StoreFull as err:
            return error(429, f"gateway queue is full: {err}", "queue_full")
        if created:
            state.runner.submit(future, job)
    answer = {"request_id": future.request_id, "sample_sequence_ids": future.sample_sequence_ids}
    return 200, orjson.dumps(answer)


def lookup(state: TinkerState, body: dict[str, Any]) -> Future | Answer:
    """``POST /api/v1/retrieve_future``: the held future, or the 404/410 answer.

    Raises :class:`BadRequest` when ``request_id`` is not a string.
    """
    request_id = body.get("request_id")
    if not isinstance(request_id, str):
        raise BadRequest("request_id must be a string")
    try:
        return state.store.get(request_id)
    except FutureUnknown:
        return error(404, f"future {request_id!r} was never issued", "not_found")
    except FutureGone:
        return error(410, f"future {request_id!r} is no longer held; resubmit", "gone")
