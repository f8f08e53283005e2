"""The ASGI front: the gateway's hot routes, answered in front of Quart.

Nearly all traffic is two OpenAI calls (``POST /v1/completions``,
``/v1/chat/completions``) and two Tinker calls (``asample``,
``retrieve_future``), so these are served by one small ASGI callable,
:class:`Front`, that wraps the Quart app once (``create_app``); every other
route is a Quart view. The front owns the request plumbing those routes share,
in this order:

1. merge repeated slashes in the path (``http://gw/`` + ``/v1/...``, as nginx's
   ``merge_slashes``); a path that is not a front route goes to Quart;
2. not serving (before startup finished, after shutdown began): 503 ``not_ready``;
3. the API key from the scope's headers (``_auth.check_auth``): 401;
4. the method: 405 with ``Allow`` (RFC 9110 §15.5.6);
5. the request id: the caller's ``X-Request-Id`` (400 naming the header if it
   is not printable ASCII of 1..128 characters) or a fresh one; every answer
   of a front route carries it back in ``X-Request-Id`` and the access log
   writes it (docs/server.md, "Request ids and rollout groups");
   the body, up to ``max_body_size`` (413; a client that hangs up while it
   arrives gets nothing), parsed as a JSON object (400);
6. the route's own translation (``Route.start``): a :class:`RequestError`
   becomes its JSON answer; otherwise it returns the work to run;
7. the work runs in one cancel scope that is cancelled when the client hangs
   up: the forward's upstream connection is closed (the engine aborts) or a
   held Tinker poll stops holding. Under our worker the cancel comes from the
   connection's own task (:mod:`._appchannel`); under any other ASGI server a
   watcher task awaiting ``http.disconnect`` runs beside the work.

The route modules only translate wire formats: ``_forward.py`` (OpenAI) and
``tinker/_fastpath.py`` (Tinker). No request/response objects, header maps or
context locals: the body bytes go on as they came.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from trioforward.server.base._errors import RequestError, error_body
from trioforward.server.base._state import STATE_KEY, GatewayState
from trioforward.server.base._validate import parse_body, request_identity
from trioforward.server.front import _gc
from trioforward.server.front._appchannel import DISCONNECT_EXTENSION, AppChannel
from trioforward.server.front._auth import check_auth
from trioforward.server.front._h11front import (
    REFUSED_EXTENSION,
    ambiguous_framing,
    refuse_ambiguous,
)
from trioforward.server.front._outcome import CLIENT_CLOSED, NO_ANSWER, Outcome

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from trioforward.dispatch.engines._tenants import Tenant

__all__ = [
    "Front",
    "Route",
    "Call",
    "Outcome",
    "CLIENT_CLOSED",
    "NO_ANSWER",
    "respond",
    "send_start",
    "Scope",
    "Receive",
    "Send",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_NOT_READY = error_body("gateway is not serving", type="server_error", code="not_ready")
_RETRY_SOON = ((b"retry-after", b"1"),)  # startup takes about a second
_SLASHES = re.compile("/{2,}")
_SLASHES_RAW = re.compile(b"/{2,}")


class Call:
    """One request on a front route, as the route's ``start`` sees it.

    ``headers``: the request headers, lower-case bytes names (the last value of
    a repeated one); ``data``: the body as a JSON object; ``body``: its bytes;
    the request id and rollout group are ``log.request_id`` and ``log.group``.
    ``tenant``: whose API key it came with (``None``: no keys, the default tenant).
    """

    __slots__ = ("state", "path", "headers", "data", "body", "send", "log", "tenant")

    def __init__(
        self,
        state: GatewayState,
        path: str,
        headers: dict[bytes, bytes],
        data: dict[str, Any],
        body: bytes,
        send: Send,
        log: Outcome,
        tenant: Tenant | None = None,
    ) -> None:
        self.state = state
        self.path = path
        self.headers = headers
        self.data = data
        self.body = body
        self.send = send
        self.log = log
        self.tenant = tenant

    def header(self, name: bytes) -> str | None:
        """A request header as text (latin-1), or ``None``."""
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")

    def refused(self, status: int, code: str | None) -> None:
        """Count this call's refusal (``status``, error ``code``) on a Tinker
        route (``Route.tinker``), in
        ``trioforward_tinker_rejections_total`` (docs/server.md, "Metrics (`GET /metrics`)")."""
        metrics = self.state.metrics
        if metrics is not None:
            metrics.rejection(self.path, status, code)


@dataclass(frozen=True, slots=True)
class Route:
    """A route the front answers.

    ``start(call)`` validates and translates the request (raising
    :class:`RequestError` for a bad one, answered by the front) and returns the
    work to run, which sends the response itself. ``empty_body``: an empty
    body means ``{}`` (Tinker) instead of a 400 (OpenAI). ``access_log``: the
    request gets an access-log line and is counted in the route metrics.
    ``tinker``: a Tinker call, whose refusals are counted in
    ``trioforward_tinker_rejections_total`` (:meth:`Call.refused`: the front's
    own, and those the route's work answers); the engines' abort routes are
    neither.
    """

    start: Callable[[Call], Awaitable[None]]
    empty_body: bool = False
    access_log: bool = False
    tinker: bool = False


class Front:
    """ASGI callable: serves ``routes`` (path -> :class:`Route`, all ``POST``) and
    passes every other scope to ``inner`` (the Quart app)."""

    def __init__(
        self, app: QuartTrio, inner: Callable[..., Awaitable[None]], routes: Mapping[str, Route]
    ) -> None:
        self.app = app
        self.inner = inner
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        if DISCONNECT_EXTENSION not in scope.get("extensions", ()) and ambiguous_framing(
            scope["headers"]
        ):
            await refuse_ambiguous(receive, send)  # another server than ours
            return
        path: str = scope["path"]
        if "//" in path:
            scope["path"] = path = _SLASHES.sub("/", path)
            scope["raw_path"] = _SLASHES_RAW.sub(b"/", scope.get("raw_path") or b"")
        route = self.routes.get(path)
        if route is None:
            await self.inner(scope, receive, send)
            return
        # Served in this frame, not a helper coroutine's: every frame of the
        # request task's await chain is touched each time the task resumes, and
        # with thousands of requests in flight each touch is a cache miss.
        state: GatewayState | None = self.app.extensions.get(STATE_KEY)
        if state is None:
            await respond(send, 503, _NOT_READY, extra=_RETRY_SOON)
            return
        headers = dict(scope["headers"])  # the last value of a repeated header
        log = Outcome(path, scope["method"])
        if state.tracing is not None and route.access_log:  # off: this test is all it costs
            log.span = state.tracing.request_span(scope["method"], path, headers)
        # Pauses the collector during bursts (tune_gc installs it). Under our worker
        # the request was counted when its task was spawned (_appchannel).
        guard = None if DISCONNECT_EXTENSION in scope.get("extensions", ()) else _gc.active
        if guard is not None:
            guard.enter()
        try:
            try:
                # The id before anything can refuse, so that every answer (401 and
                # 405 included) carries it; a bad one is refused after the key and
                # the method, as before: no 405 or 400 to an unknown caller.
                try:
                    log.request_id, log.group = request_identity(headers, state.client)
                    bad_id = None
                except RequestError as err:
                    bad_id = err
                tenant = check_auth(
                    state.settings, path, lambda n: _text(headers.get(n.encode())), state.client.tenants
                )
                if scope["method"] != "POST":
                    raise RequestError(405, f"{path} accepts POST only", code="method_not_allowed")
                if bad_id is not None:
                    raise bad_id
                body = await _read_body(receive, headers, state.settings.max_body_size)
                data = parse_body(body, allow_empty=route.empty_body)
                if log.span is not None:
                    state.tracing.request_body(log.span, data)
                log.tenant = (tenant or state.client.tenants.default).name
                work = route.start(Call(state, path, headers, data, body, send, log, tenant))
            except RequestError as err:
                log.status = err.status
                if route.tinker and state.metrics is not None:
                    state.metrics.rejection(path, err.status, err.code)
                extra = ((b"allow", b"POST"),) if err.status == 405 else err.headers()
                if log.request_id is not None:
                    extra = (*extra, (b"x-request-id", log.request_id.encode()))
                await respond(send, err.status, err.body(), extra=extra)
                return
            except _Disconnected:
                # The front refused the body (and answered for it), or the client left.
                refused = scope["extensions"].get(REFUSED_EXTENSION) if "extensions" in scope else None
                log.status = CLIENT_CLOSED if refused is None else refused
                if refused is not None:
                    log.error = "malformed_request"
                return
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
        except trio.Cancelled:  # the server's (a hang-up is caught above): the grace ended
            log.cut()
            raise
        finally:
            if guard is not None:
                guard.exit()
            if route.access_log:
                log.finish(state)


async def respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """A whole response: ``body`` with its type and length (one write, see _worker)."""
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *extra]
    # Not shielded (send_start): nothing here answers again if the head's send is
    # cancelled, so the worst case is a connection closed with nothing sent (the
    # worker contains the error), and the shield would cost ~5 µs on every answer.
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_start(send: Send, message: dict[str, Any]) -> None:
    """Send an ``http.response.start`` message shielded from cancellation.

    Hypercorn hands the head to h11 first and writes it after, and only then
    records that the response started (``HTTPStream.app_send``). A cancel landing
    in between (the write's checkpoint) leaves h11 past the head while Hypercorn
    is before it: the app, told the head did not go out, would send another one,
    which h11 refuses, and Hypercorn's 500 after it raises out of the connection.
    Shielded, the head goes out whole and the cancel lands at the app's next
    checkpoint, with the response started. The write is a non-blocking
    ``os.write`` under our worker, and Hypercorn's own writes are shielded."""
    with trio.CancelScope(shield=True):
        await send(message)


class _Disconnected(Exception):
    """The client hung up while the request body was arriving."""


async def _read_body(receive: Receive, headers: dict[bytes, bytes], limit: int) -> bytes:
    """The whole request body. Raises :class:`RequestError` (413) past ``limit``
    bytes (declared or received) and :class:`_Disconnected`."""
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
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
                raise _too_large(limit)
            parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _too_large(limit: int) -> RequestError:
    return RequestError(413, f"request body larger than {limit} bytes", code="request_too_large")


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class _Hangup:
    """Called by :class:`AppChannel` when the client hangs up: cancels the work
    unless its last response message is already being sent."""

    __slots__ = ("cancel", "log")

    def __init__(self, cancel: trio.CancelScope, log: Outcome) -> None:
        self.cancel = cancel
        self.log = log

    def __call__(self) -> None:
        if not self.log.complete:
            self.log.status = CLIENT_CLOSED
            self.cancel.cancel()


async def _watch_disconnect(receive: Receive, cancel_scope: trio.CancelScope, log: Outcome) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            # Hypercorn also reports a disconnect once the response is complete.
            if not log.complete:
                log.status = CLIENT_CLOSED
                cancel_scope.cancel()
            return
