"""The OpenAI data plane: ``POST /v1/completions`` and ``POST /v1/chat/completions``.

These two routes carry nearly all of the gateway's traffic; the ASGI front
(:mod:`._asgi`) answers them in front of Quart and does the request plumbing
(auth, body, JSON, disconnect). This module only translates: it validates the
body (:mod:`._validate`) and forwards it with the dispatch client.

- **one task per request, one cancel scope** (the front's): when the client hangs
  up, the dispatch core closes the upstream connection at once (the engine
  aborts the generation, vLLM semantics) and nothing is retried (docs/dispatch.md).
  A streamed body is relayed from inside the ``client.stream`` block of the same
  task, so the upstream stream's lifetime is syntactic — no generator handed to
  a framework that may never iterate or close it;
- **backpressure**: each chunk is passed to Hypercorn's ``send`` and awaited, so
  the upstream is read only as fast as the client reads;
- **cheap**: the engine's body bytes are sent as they came.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import trio

from trioforward import Phase
from trioforward.dispatch import STALENESS_HEADER
from trioforward.errors import EngineRejected, TrioforwardError, UpstreamBroken
from trioforward.server.base._errors import (
    RequestError,
    dispatch_error_body,
    dispatch_error_headers,
    passed_on,
)
from trioforward.server.base._state import GatewayState
from trioforward.server.base._validate import validate_chat, validate_completion, weight_policy
from trioforward.server.front._asgi import Call, Outcome, Route, Send, respond, send_start
from trioforward.server.proxy._served_model import fill_model
from trioforward.server.proxy._sessions import session_turn
from trioforward.server.proxy._timing import server_timing
from trioforward.sessions import session_servable

__all__ = ["ROUTES", "FORWARDED", "forward", "relay_stream"]
# Longest SSE event held while waiting for its end (an SGLang stream repeats the
# whole output in each event): beyond, the stream ends with an error event.
MAX_EVENT_BYTES = 16 << 20

_VALIDATE = {
    "/v1/completions": validate_completion,
    "/v1/chat/completions": validate_chat,
}
# Request headers worth passing to the engine; everything else (the client's API
# key above all) stays at the gateway. X-Request-Id goes too, but as each
# attempt's engine-side id (docs/server.md, "Request ids and rollout groups").
FORWARDED = _FORWARDED = frozenset({b"x-session-id", b"traceparent", b"tracestate"})
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
# The weight version that produced an answer (docs/operations.md, "Weight versions").
_VERSION = b"x-weight-version"


def _start(call: Call) -> Awaitable[None]:
    """Validate an OpenAI body and return the forward that answers it."""
    _VALIDATE[call.path](call.data)
    log = call.log
    forward: dict[str, Any] = {
        "json": call.data,
        "content": call.body,
        "headers": [(k, v) for k, v in call.headers.items() if k in _FORWARDED],
        "session": call.header(b"x-session-id"),
        "on_dispatch": log.dispatching,
        "span": log.span,  # None unless the gateway traces
        "request_id": log.request_id,
        "group": log.group,
        "tenant": call.tenant,
        "weight_policy": weight_policy(call.headers),
    }
    if forward["session"] is not None and call.path == "/v1/chat/completions" and _in_session(call):
        return session_turn(call, forward, _relay_stream)  # agent sessions: docs/sessions.md
    if not call.data.get("model"):
        return _without_model(call, forward)
    if call.data.get("stream"):
        return _relay_stream(call.state, call.path, forward, call.send, log)
    return _forward(call.state, call.path, forward, call.send, log)


def _in_session(call: Call) -> bool:
    return bool(call.state.settings.chat_sessions) and session_servable(call.data)


async def _without_model(call: Call, forward: dict[str, Any]) -> None:
    """A body without ``model``: given the one served model first (_served_model.py)."""
    try:
        filled = await fill_model(call.state, call.data)
    except RequestError as err:
        call.log.status, call.log.error = err.status, err.code
        call.log.complete = True
        await respond(call.send, err.status, err.body(), extra=(_id_header(call.log),))
        return
    if filled:
        forward["content"] = orjson.dumps(call.data)
    if call.data.get("stream"):
        await _relay_stream(call.state, call.path, forward, call.send, call.log)
    else:
        await _forward(call.state, call.path, forward, call.send, call.log)


ROUTES = {
    path: Route(_start, access_log=True) for path in ("/v1/completions", "/v1/chat/completions")
}


async def _forward(
    state: GatewayState,
    path: str,
    call: dict[str, Any],
    send: Send,
    log: Outcome,
    transform: Callable[[bytes], bytes] | None = None,
) -> None:
    """A non-streaming forward; ``call``: keyword arguments of ``Client.request``;
    ``transform``: applied to a 2xx body (the token routes put the caller's id back)."""
    started = trio.current_time()
    try:
        # Not .post: one frame less in the await chain (see Front.__call__ in _asgi.py).
        response = await state.client.request("POST", path, **call)
    except TrioforwardError as err:
        await _send_dispatch_error(send, err, log)
        return
    finally:
        log.until(started)  # a client that hung up: where its time went
    log.dispatched(response.engine, response.attempts, response.queue_time, response.engine_time)
    log.status = response.status
    log.complete = True
    log.admission_time = response.admission_time
    timing = server_timing(
        log.arrival, response.queue_time, response.engine_time, response.admission_time
    )
    extra = (*passed_on(response.headers), timing, _id_header(log))
    version = log.version = response.weight_version
    if version is not None:
        extra = (*extra, (_VERSION, version.encode()))
    if response.staleness is not None:
        log.staleness = response.staleness
        extra = (*extra, (STALENESS_HEADER, b"%d" % response.staleness))
    content = response.content
    if transform is not None and 200 <= response.status < 300:
        content = transform(content)
    await respond(send, response.status, content, _content_type(response.headers), extra)


async def _relay_stream(
    state: GatewayState,
    path: str,
    call: dict[str, Any],
    send: Send,
    log: Outcome,
    transform: Callable[[bytes], bytes] | None = None,
) -> None:
    """A streamed forward, relayed chunk by chunk; ``call`` and ``transform`` (applied
    to whole events) as for :func:`_forward`.

    Once the 200 head has gone out the body always ends well-formed, whatever
    ends the stream (engine closed or broke it, deadline, ``read_timeout``, pause
    ``mode="abort"``, engine removed): one SSE error event on an event boundary —
    bytes of an unfinished event are held back and dropped, so a client never
    parses a fragment — then the end of the chunked body. Never ``[DONE]`` after
    a failure and never a second response start (docs/server.md, the OpenAI API's
    streaming rules). The access log and metrics record what the client got: 200
    plus the error code.
    """
    started = trio.current_time()
    head_sent = False
    try:
        async with state.client.stream(path, **call) as fs:
            log.dispatched(fs.engine, fs.attempts, fs.queue_time, None)
            log.status = fs.status
            if not 200 <= fs.status < 300:
                # The engine refused before streaming: its error body goes back verbatim.
                content = b"".join([chunk async for chunk in fs.aiter_bytes()])
                log.complete = True
                timing = server_timing(log.arrival, fs.queue_time, fs.engine_time)
                extra = (*passed_on(fs.headers), timing, _id_header(log))
                await respond(send, fs.status, content, _content_type(fs.headers), extra)
                return
            # Server-Timing of a stream: what is known at its head (module _timing).
            log.admission_time = fs.admission_time
            timing = server_timing(log.arrival, fs.queue_time, fs.engine_time, fs.admission_time)
            extra = (*passed_on(fs.headers), timing, _id_header(log))
            version = log.version = fs.weight_version  # at dispatch: docs/operations.md
            if version is not None:
                extra = (*extra, (_VERSION, version.encode()))
            staleness = fs.staleness  # as the head goes out (docs/operations.md)
            if staleness is not None:
                extra = (*extra, (STALENESS_HEADER, b"%d" % staleness))
            head = [*_SSE, *extra]
            # Shielded: a cancel (an abort pause, a deadline) must not land between
            # h11 taking the head and Hypercorn recording it (send_start).
            await send_start(send, {"type": "http.response.start", "status": fs.status, "headers": head})
            head_sent = True
            partial = b""  # an event not yet complete: sent only with its end
            async for chunk in fs.aiter_bytes():
                if partial and not fs.cut:  # cut: an abort call's tail, whole events
                    chunk = partial + chunk
                end = _events_end(chunk)
                partial = chunk[end:]
                if len(partial) > MAX_EVENT_BYTES:
                    raise UpstreamBroken(
                        f"an event of the engine's stream is over {MAX_EVENT_BYTES} bytes",
                        phase=Phase.READ_BODY,
                    )
                if end:
                    events = chunk[:end] if transform is None else transform(chunk[:end])
                    await send({"type": "http.response.body", "body": events, "more_body": True})
            log.complete = True
            # What the whole answer took: a continuation's attempts, and both
            # versions when an update came while it ran (as for a whole answer).
            log.attempts, log.version = fs.attempts, fs.final_version
            log.staleness = fs.staleness
            # The engine ended its stream cleanly: whatever it sent last is its own.
            await send({"type": "http.response.body", "body": partial, "more_body": False})
    except TrioforwardError as err:
        if not head_sent:
            await _send_dispatch_error(send, err, log)
            return
        # Here the stream context has exited: capacity and connection are released.
        log.dispatched(err.engine, err.attempts, err.queue_time, err.engine_time)
        log.error = err.code
        log.complete = True
        if state.metrics is not None:
            state.metrics.stream_error(log.route, err.code)
        event = b"data: " + orjson.dumps(err.to_json()) + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": False})
    finally:
        log.until(started)


def _events_end(data: bytes) -> int:
    """Length of the complete SSE events at the start of ``data``: up to the last
    blank line (``\\n\\n`` or ``\\r\\n\\r\\n``; WHATWG HTML §9.2.6, event stream parsing)."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


async def _send_dispatch_error(send: Send, err: TrioforwardError, log: Outcome) -> None:
    log.dispatched(err.engine, err.attempts, err.queue_time, err.engine_time)
    log.status, log.error = err.status, err.code
    log.complete = True
    timing = server_timing(log.arrival, err.queue_time, err.engine_time or 0.0)
    if isinstance(err, EngineRejected):
        extra = (*passed_on(err.headers), timing, _id_header(log))
        await respond(send, err.status, err.body, _content_type(err.headers), extra)
    else:
        extra = (*dispatch_error_headers(err), timing, _id_header(log))
        await respond(send, err.status, dispatch_error_body(err), extra=extra)


def _id_header(log: Outcome) -> tuple[bytes, bytes]:
    """The answer's ``X-Request-Id``: the request's own id (the front set it)."""
    return (b"x-request-id", (log.request_id or "").encode())


def _content_type(headers: list[tuple[bytes, bytes]]) -> bytes:
    for key, value in headers:
        if key == b"content-type":
            return value
    return b"application/json"


forward = _forward  # the token routes' (_native.py)
relay_stream = _relay_stream
