"""The OpenAI data plane: ``POST /v1/completions`` and ``POST /v1/chat/completions``.

These two routes carry nearly all of the gateway's traffic, so they are served by
a small ASGI layer in front of the Quart app instead of by Quart views:

- **one task per request, one cancel scope.** When the client hangs up, the
  forward's scope is cancelled, the dispatch core closes the upstream connection
  at once (the engine aborts the generation, vLLM semantics) and nothing is
  retried (DESIGN §4). Under our worker the cancel comes from the connection's
  own task as Hypercorn reports the disconnect (:mod:`._appchannel`); under any
  other ASGI server a watcher task awaiting ``http.disconnect`` runs beside the
  forward in a nursery. A streamed body is relayed from inside the
  ``client.stream`` block of the same task, so the upstream stream's lifetime is
  syntactic — no generator handed to a framework that may never iterate or close
  it;
- **backpressure**: each chunk is passed to Hypercorn's ``send`` and awaited, so
  the upstream is read only as fast as the client reads;
- **cheap**: no request/response objects, header maps or context locals; the
  engine's body bytes are sent as they came.

Everything else (``/v1/models``, admin, metrics, Tinker) goes to Quart.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import orjson
import trio

from trioforward.errors import EngineRejected, TrioforwardError
from trioforward.server import _gc
from trioforward.server._appchannel import DISCONNECT_EXTENSION, AppChannel
from trioforward.server._auth import check_auth
from trioforward.server._errors import RequestError, dispatch_error_body
from trioforward.server._state import STATE_KEY, GatewayState
from trioforward.server._validate import parse_body, validate_chat, validate_completion

if TYPE_CHECKING:
    from quart_trio import QuartTrio

__all__ = ["OpenAIForwarder", "ROUTES", "CLIENT_CLOSED"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

ROUTES = {
    "/v1/completions": validate_completion,
    "/v1/chat/completions": validate_chat,
}
# nginx's "client closed request": logged and counted when the client hung up.
CLIENT_CLOSED = 499
# Request headers worth passing to the engine; everything else (the client's API
# key above all) stays at the gateway.
_FORWARDED = frozenset({b"x-request-id", b"x-session-id", b"traceparent", b"tracestate"})
_ALLOW_POST = ((b"allow", b"POST"),)
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

_SLASHES = re.compile("/{2,}")
_SLASHES_RAW = re.compile(b"/{2,}")

access_log = logging.getLogger("trioforward.access")


class _Disconnected(Exception):
    """The client hung up while the request body was arriving."""


class OpenAIForwarder:
    """ASGI callable: serves :data:`ROUTES` itself and passes other scopes to ``inner``."""

    def __init__(self, app: QuartTrio, inner: Callable[..., Awaitable[None]]) -> None:
        self.app = app
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        path: str = scope["path"]
        if "//" in path:
            # A base URL with a trailing slash ("http://gw:8000/" + "/v1/...")
            # means the single-slash route, as nginx's merge_slashes does.
            scope["path"] = path = _SLASHES.sub("/", path)
            scope["raw_path"] = _SLASHES_RAW.sub(b"/", scope.get("raw_path") or b"")
        if path not in ROUTES:
            await self.inner(scope, receive, send)
            return
        # Served in this frame, not a helper coroutine's: every frame of the
        # request task's await chain is touched each time the task resumes, and
        # with thousands of requests in flight each touch is a cache miss.
        state: GatewayState | None = self.app.extensions.get(STATE_KEY)
        if state is None:
            await _respond(
                send,
                503,
                b'{"error":{"message":"gateway is not serving","type":"server_error","code":"not_ready","param":null}}',
            )
            return
        headers = {name: value for name, value in scope["headers"]}
        log = _Outcome(path, scope["method"])
        guard = _gc.active  # pauses the collector during bursts (tune_gc installs it)
        if guard is not None:
            guard.enter()
        try:
            try:
                # The key first, as on every other route: no 405 to an unknown caller.
                check_auth(state.settings, path, lambda n: _text(headers.get(n.encode())))
                if scope["method"] != "POST":
                    raise RequestError(405, f"{path} accepts POST only", code="method_not_allowed")
                body = await _read_body(receive, headers, state.settings.max_body_size)
                data = parse_body(body)
                ROUTES[path](data)
            except RequestError as err:
                log.status = err.status
                # RFC 9110 §15.5.6: a 405 lists the allowed methods.
                extra = _ALLOW_POST if err.status == 405 else ()
                await _respond(send, err.status, err.body(), extra=extra)
                return
            except _Disconnected:
                log.status = CLIENT_CLOSED
                return
            forward_headers = [(k, v) for k, v in headers.items() if k in _FORWARDED]
            call: dict[str, Any] = {
                "json": data,
                "content": body,
                "headers": forward_headers,
                "session": _text(headers.get(b"x-session-id")),
                "on_dispatch": log.dispatching,
            }
            if data.get("stream"):
                work = _relay_stream(state, path, call, send, log)
            else:
                work = _forward(state, path, call, send, log)
            channel: AppChannel | None = scope["extensions"].get(DISCONNECT_EXTENSION)
            if channel is None:  # another server than ours: a watcher task
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope, log)
                    await work
                    nursery.cancel_scope.cancel()
            else:
                with trio.CancelScope() as cancel:
                    channel.on_disconnect = _Hangup(cancel, log)
                    if channel.disconnected:
                        channel.on_disconnect()
                    try:
                        await work
                    finally:
                        channel.on_disconnect = None
        finally:
            if guard is not None:
                guard.exit()
            log.finish(state)


async def _forward(
    state: GatewayState, path: str, call: dict[str, Any], send: Send, log: _Outcome
) -> None:
    """A non-streaming forward; ``call``: keyword arguments of ``Client.request``."""
    started = trio.current_time()
    try:
        # Not .post: one frame less in the await chain (see OpenAIForwarder.__call__).
        response = await state.client.request("POST", path, **call)
    except TrioforwardError as err:
        await _send_dispatch_error(send, err, log)
        return
    finally:
        log.until(started)  # a client that hung up: where its time went
    log.dispatched(response.engine, response.attempts, response.queue_time, response.engine_time)
    log.status = response.status
    log.complete = True
    await _respond(send, response.status, response.content, _content_type(response.headers))


async def _relay_stream(
    state: GatewayState, path: str, call: dict[str, Any], send: Send, log: _Outcome
) -> None:
    """A streamed forward, relayed chunk by chunk; ``call`` as for :func:`_forward`."""
    started = trio.current_time()
    try:
        async with state.client.stream(path, **call) as fs:
            log.dispatched(fs.engine, fs.attempts, fs.queue_time, None)
            log.status = fs.status
            if not 200 <= fs.status < 300:
                # The engine refused before streaming: its error body goes back verbatim.
                content = b"".join([chunk async for chunk in fs.aiter_bytes()])
                log.complete = True
                await _respond(send, fs.status, content, _content_type(fs.headers))
                return
            await send({"type": "http.response.start", "status": fs.status, "headers": _SSE})
            last = b"\n\n"
            try:
                async for chunk in fs.aiter_bytes():
                    if chunk:
                        last = chunk
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except TrioforwardError as err:
                # Mid-stream failure: an error event ends the stream, never a fake [DONE].
                log.status, log.error = err.status, err.code
                prefix = b"" if last.endswith(b"\n\n") else b"\n\n"
                event = prefix + b"data: " + orjson.dumps(err.to_json()) + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
            log.complete = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except TrioforwardError as err:
        await _send_dispatch_error(send, err, log)
    finally:
        log.until(started)


async def _send_dispatch_error(send: Send, err: TrioforwardError, log: _Outcome) -> None:
    log.dispatched(err.engine, err.attempts, err.queue_time, err.engine_time)
    log.status, log.error = err.status, err.code
    log.complete = True
    if isinstance(err, EngineRejected):
        await _respond(send, err.status, err.body, _content_type(err.headers))
    else:
        await _respond(send, err.status, dispatch_error_body(err))


class _Hangup:
    """Called by :class:`AppChannel` when the client hangs up: cancels the forward
    (the dispatch core closes the upstream connection; nothing is retried)."""

    __slots__ = ("cancel", "log")

    def __init__(self, cancel: trio.CancelScope, log: _Outcome) -> None:
        self.cancel = cancel
        self.log = log

    def __call__(self) -> None:
        if not self.log.complete:  # the response's last message is not being sent yet
            self.log.status = CLIENT_CLOSED
            self.cancel.cancel()


async def _watch_disconnect(
    receive: Receive, cancel_scope: trio.CancelScope, log: _Outcome
) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            # Hypercorn also reports a disconnect once the response is complete.
            if not log.complete:
                log.status = CLIENT_CLOSED
                cancel_scope.cancel()
            return


async def _read_body(receive: Receive, headers: dict[bytes, bytes], limit: int) -> bytes:
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"request body larger than {limit} bytes", code="request_too_large")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise RequestError(
                    413, f"request body larger than {limit} bytes", code="request_too_large"
                )
            parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """A whole response: ``body`` with its type and length (one write, see _worker)."""
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _content_type(headers: list[tuple[bytes, bytes]]) -> bytes:
    return _header(headers, b"content-type") or b"application/json"


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class _Outcome:
    """What one request's access-log line and metrics record (times in seconds)."""

    __slots__ = (
        "route",
        "method",
        "status",
        "engine",
        "attempts",
        "queue_time",
        "engine_time",
        "error",
        "complete",
    )

    def __init__(self, route: str, method: str = "POST") -> None:
        self.route = route
        self.method = method  # a GET answered 405 is logged as a GET
        self.status = 500
        self.engine: str | None = None
        self.attempts = 0
        self.queue_time = 0.0
        self.engine_time: float | None = None
        self.error: str | None = None
        self.complete = False  # the last body message is being sent

    def dispatching(self, engine: str, attempts: int, queue_time: float) -> None:
        """An attempt starts (``Client.post``'s ``on_dispatch``)."""
        self.engine, self.attempts, self.queue_time = engine, attempts, queue_time

    def until(self, started: float) -> None:
        """Times of a request whose dispatch did not report them (a client that
        hung up; a stream, whose engine time runs until its end), from
        ``started`` (handed to the dispatch core) to now: all queue time if it
        never reached an engine, else engine time after its queue time."""
        if self.engine_time is not None:
            return
        elapsed = trio.current_time() - started
        if self.engine is None:
            self.queue_time = elapsed
            self.engine_time = 0.0
        else:
            self.engine_time = max(0.0, elapsed - self.queue_time)

    def dispatched(
        self, engine: str | None, attempts: int, queue_time: float, engine_time: float | None
    ) -> None:
        self.engine, self.attempts, self.queue_time, self.engine_time = (
            engine,
            attempts,
            queue_time,
            engine_time,
        )

    def finish(self, state: GatewayState | None) -> None:
        if state is None:
            return
        dispatched = self.attempts > 0 or self.engine is not None
        if state.metrics is not None:
            state.metrics.observe(
                self.route,
                self.status,
                queue_time=self.queue_time if dispatched else None,
                engine_time=self.engine_time if dispatched else None,
            )
        if state.settings.access_log and access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "%s %s %d engine=%s attempts=%d queue=%.3fs engine_time=%.3fs%s",
                self.method,
                self.route,
                self.status,
                self.engine or "-",
                self.attempts,
                self.queue_time,
                self.engine_time or 0.0,
                f" error={self.error}" if self.error else "",
            )
