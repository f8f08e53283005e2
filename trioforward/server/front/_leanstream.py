"""The lean per-request stream: a private hook into Hypercorn 0.18's ``H11Protocol``
(used by our worker, ``_tcpserver``; built on ``_h11front.FrontH11Protocol``, whose
refusals of ambiguous framings and JSON error answers it keeps).

Hypercorn serves each HTTP/1.1 request through an ``HTTPStream``: the protocol
turns the h11 request into a ``Request`` stream event (decoding every header name
again on the way), the stream builds the scope and spawns the app, and each ASGI
message the app sends becomes a stream event (a frozen dataclass: ``Response``,
``Body``, ``EndBody``, ``StreamClosed``) that the protocol turns into an h11 event
and bytes, with the response headers validated by Hypercorn, then again by h11,
and the ``date`` header formatted per answer. :class:`LeanH11Protocol` keeps
Hypercorn's parsing (``_handle_events``: h11, ``Expect: 100-continue``, its error
answers, keep-alive recycling, HTTP/2 upgrades) and serves every request that
carries no ``Upgrade`` header (and when ``server_names`` is not set) with a
:class:`LeanStream`: the same scope built once, the app spawned straight into the
connection's task group, its messages serialized straight with the connection's
h11 ``Connection`` and written once per fixed-length answer, the ``date`` and
``server`` headers computed once per second. Upgrades (WebSocket, h2c) take
Hypercorn's own path. The same bytes, scope and messages as stock Hypercorn are
asserted by ``tests/server/test_worker_vs_hypercorn.py``; the gain is in
docs/performance.md ("Private hooks").

What it relies on, checked by ``tests/server/test_private_hooks.py`` (source
fingerprints; fails when the pinned Hypercorn changes any of it):

- ``H11Protocol._handle_events`` calling ``_check_protocol(request)`` then
  ``_create_stream(request)`` per request and handing ``Body`` / ``EndBody``
  events to ``self.stream.handle``; ``handle(Closed())`` calling
  ``_close_stream``, which hands ``StreamClosed`` to the stream;
  ``_maybe_recycle`` (the end of a request: what ``stream_send(StreamClosed)``
  does); ``_send_h11_event``'s rule (a ``LocalProtocolError`` is dropped when
  their side is in ``ERROR``); the attributes ``app``, ``config``, ``context``,
  ``task_group``, ``connection``, ``connection_state``, ``client``, ``server``,
  ``ssl``, ``send``, ``stream``, ``keep_alive_requests``;
- what ``HTTPStream.handle``/``app_send``/``_send_closed``/``_send_error_response``
  and ``H11Protocol.stream_send``/``_create_stream``/``_check_protocol`` do for an
  HTTP/1 request, re-implemented here: the scope's keys, header validation
  (``build_and_validate_headers``), ``suppress_body``, ``Config.response_headers``,
  ``keep_alive_max_requests``, the access-log calls, the 500 before a response;
- h11's ``Headers._full_items`` (the request headers copied in C, as the pool's
  ``http/_h11_hooks.py`` does).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from operator import itemgetter
from time import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from hypercorn.config import Config
from hypercorn.events import RawData
from hypercorn.protocol.events import Body, EndBody, StreamClosed
from hypercorn.protocol.http_stream import ASGIHTTPState
from hypercorn.utils import UnexpectedMessageError, suppress_body

from trioforward._h11 import front_h11
from trioforward.server.front._h11front import FrontH11Protocol

if TYPE_CHECKING:
    import h11
else:
    h11 = front_h11()  # the h11 Hypercorn's protocol uses (trioforward._h11)

__all__ = ["LeanH11Protocol", "LeanStream"]

_NAME_VALUE = itemgetter(1, 2)
_REQUEST, _RESPONSE = ASGIHTTPState.REQUEST, ASGIHTTPState.RESPONSE
_TRAILERS, _CLOSED = ASGIHTTPState.TRAILERS, ASGIHTTPState.CLOSED


def _has_upgrade(request: h11.Request) -> bool:
    for item in request.headers._full_items:
        if item[1] == b"upgrade":
            return True
    return False


class LeanH11Protocol(FrontH11Protocol):
    """Hypercorn's ``H11Protocol`` (with the front's refusals of
    :class:`~._h11front.FrontH11Protocol`) serving plain requests with a
    :class:`LeanStream` (module docstring). The connection's task group must be an
    ``AppTaskGroup``."""

    async def _check_protocol(self, event: h11.Request) -> None:
        # Hypercorn's looks for an h2c upgrade (an Upgrade header) and the HTTP/2
        # preface (method PRI): without either it does nothing.
        if event.method == b"PRI" or _has_upgrade(event):
            await super()._check_protocol(event)

    async def _create_stream(self, request: h11.Request) -> None:
        # One pass over the headers: an upgrade takes Hypercorn's path, both
        # Content-Length and Transfer-Encoding FrontH11Protocol's refusal.
        other = bool(self.config.server_names)
        length = coding = False
        for item in request.headers._full_items:
            name = item[1]
            if name == b"content-length":
                length = True
            elif name == b"transfer-encoding":
                coding = True
            elif name == b"upgrade":
                other = True
        if other or (length and coding):
            await super()._create_stream(request)
            return
        stream = LeanStream(self)
        self.stream = stream  # type: ignore[assignment]
        await stream.start(request)
        self.keep_alive_requests += 1
        await self.context.mark_request()


class _Headers:
    """``Config.response_headers("h11")`` (``date``, ``server``, ``alt-svc``),
    computed once per second per config instead of once per answer."""

    __slots__ = ("config", "second", "headers")

    def __init__(self) -> None:
        self.config: Config | None = None
        self.second = -1
        self.headers: list[tuple[bytes, bytes]] = []

    def get(self, config: Config) -> list[tuple[bytes, bytes]]:
        now = int(time())
        if now != self.second or config is not self.config:
            self.config, self.second = config, now
            self.headers = config.response_headers("h11")
        return self.headers


_response_headers = _Headers()


class LeanStream:
    """One plain HTTP/1.1 request of a :class:`LeanH11Protocol` connection: what
    Hypercorn's ``HTTPStream`` and ``H11Protocol.stream_send`` do for it, without
    the stream events in between."""

    __slots__ = (
        "protocol",
        "scope",
        "app_put",
        "state",
        "closed",
        "start_time",
        "response",
        "suppress",
        "held",
    )

    def __init__(self, protocol: LeanH11Protocol) -> None:
        self.protocol = protocol
        self.state = _REQUEST
        self.closed = False
        self.held: bytes | None = None  # a fixed-length answer's head, sent with its body
        self.app_put: Callable[[Any], Awaitable[None]] | None = None
        self.response: dict[str, Any] = {}
        self.suppress = False
        self.scope: dict[str, Any] = {}
        self.start_time = 0.0

    async def start(self, request: h11.Request) -> None:
        """Build the scope (the keys and values ``HTTPStream`` gives an HTTP/1
        request) and spawn the app."""
        self.start_time = time()
        protocol = self.protocol
        config = protocol.config
        if config.h11_pass_raw_headers:
            headers = request.headers.raw_items()
        else:
            headers = list(map(_NAME_VALUE, request.headers._full_items))
        path, _, query_string = request.target.partition(b"?")
        self.scope = {
            "type": "http",
            "http_version": request.http_version.decode(),
            "asgi": {"spec_version": "2.1", "version": "3.0"},
            "method": request.method.decode("ascii").upper(),
            "scheme": "https" if protocol.ssl else "http",
            "path": unquote(path.decode("ascii")),
            "raw_path": path,
            "query_string": query_string,
            "root_path": config.root_path,
            "headers": headers,
            "client": protocol.client,
            "server": protocol.server,
            "state": protocol.connection_state.copy(),
            "extensions": {},
        }
        spawn = protocol.task_group.spawn_app_direct  # type: ignore[attr-defined]
        self.app_put = await spawn(protocol.app, config, self.scope, self.app_send)

    async def handle(self, event: Any) -> None:
        """The request's body events and its end (``StreamClosed``), from the protocol."""
        if self.closed:
            return
        kind = type(event)
        put = self.app_put
        assert put is not None
        if kind is Body:
            await put({"type": "http.request", "body": bytes(event.data), "more_body": True})
        elif kind is EndBody:
            await put({"type": "http.request", "body": b"", "more_body": False})
        elif kind is StreamClosed:
            self.closed = True
            if self.state is not _CLOSED:
                config = self.protocol.config
                await config.log.access(self.scope, None, time() - self.start_time)  # type: ignore[arg-type]
            await put({"type": "http.disconnect"})

    async def app_send(self, message: Any) -> None:
        """The app's ``send`` (``None`` once the app has ended)."""
        protocol = self.protocol
        if message is None:
            if not self.closed:
                if self.state is _REQUEST:
                    await self._send_error_response(500)
                elif self.held is not None:
                    # A head without its body (the app failed or was cancelled):
                    # written, as Hypercorn had, before the connection closes.
                    held, self.held = self.held, None
                    await protocol.send(RawData(data=held))
                await protocol._maybe_recycle()
            return
        kind = message["type"]
        state = self.state
        if kind == "http.response.start" and state is _REQUEST:
            status = int(message["status"])
            fixed = False
            headers: list[tuple[bytes, bytes]] = []
            append = headers.append
            for name, value in message.get("headers", ()):
                # Hypercorn's build_and_validate_headers, without the bytes() copies
                # of what already is bytes (an app's headers nearly always are).
                if type(name) is not bytes or type(value) is not bytes:
                    name, value = bytes(name), bytes(value)
                if name[0] == 58:  # b":"
                    raise ValueError("Pseudo headers are not valid")
                name = name.strip()
                if len(name) == 14 and name.lower() == b"content-length":
                    fixed = True
                append((name, value.strip()))
            self.response = message
            self.suppress = suppress_body(self.scope["method"], status)
            data = self._serialize(self._head(status, headers))
            self.state = _RESPONSE
            if data is not None:
                if fixed and status >= 200:
                    self.held = data  # written with the body: one write per answer
                else:
                    await protocol.send(RawData(data=data))
        elif kind == "http.response.body" and state is _RESPONSE:
            out = self.held or b""
            self.held = None
            body = message.get("body", b"")
            if not self.suppress and body != b"":
                out += self._serialize(h11.Data(data=bytes(body))) or b""
            if message.get("more_body", False):
                if out:
                    await protocol.send(RawData(data=out))
            elif self.response.get("trailers", False):
                self.state = _TRAILERS
                if out:
                    await protocol.send(RawData(data=out))
            else:
                out += self._serialize(h11.EndOfMessage()) or b""
                if out:
                    await protocol.send(RawData(data=out))
                self.state = _CLOSED
                await protocol.config.log.access(self.scope, self.response, time() - self.start_time)  # type: ignore[arg-type]
                await protocol._maybe_recycle()
        else:
            raise UnexpectedMessageError(state, kind)

    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> Any:
        """The h11 event of a response head, as ``H11Protocol.stream_send`` builds it."""
        protocol = self.protocol
        config = protocol.config
        if status >= 200:
            headers += _response_headers.get(config)
            # During the shutdown drain no connection is reused (_maybe_recycle
            # closes it after the answer): say so, or a client reusing it meets a
            # close with no answer (docs/server.md, "Shutdown").
            if (
                protocol.keep_alive_requests >= config.keep_alive_max_requests
                or protocol.context.terminated.is_set()
            ):
                headers.append((b"connection", b"close"))
            return h11.Response(headers=headers, status_code=status)
        headers += _response_headers.get(config)
        return h11.InformationalResponse(headers=headers, status_code=status)

    def _serialize(self, event: Any) -> bytes | None:
        """``event``'s bytes, or ``None`` where ``_send_h11_event`` sends nothing
        (h11 refuses it while their side is in ``ERROR``)."""
        connection = self.protocol.connection
        try:
            return connection.send(event)
        except h11.LocalProtocolError:
            if connection.their_state != h11.ERROR:
                raise
            return None

    async def _send_error_response(self, status: int) -> None:
        """``HTTPStream._send_error_response``: an empty answer that closes the connection."""
        head = self._head(status, [(b"content-length", b"0"), (b"connection", b"close")])
        out = (self._serialize(head) or b"") + (self._serialize(h11.EndOfMessage()) or b"")
        if out:
            await self.protocol.send(RawData(data=out))
        self.state = _CLOSED
        await self.protocol.config.log.access(
            self.scope, {"status": status, "headers": []}, time() - self.start_time  # type: ignore[arg-type]
        )
