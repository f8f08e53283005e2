"""The HTTP/1.1 framings the front refuses, answered as JSON: a private hook into
Hypercorn 0.18's ``H11Protocol`` (used by our worker, ``_tcpserver``).

h11 frames a request that carries both ``Content-Length`` and
``Transfer-Encoding: chunked`` by the chunked coding alone (RFC 9112 §6.3), and
Hypercorn then reads the next request from what follows the chunked body on the
same connection. Behind a proxy that frames by ``Content-Length`` the two disagree
on where the request ends, so a client can smuggle a request (an admin call) past
the proxy. RFC 9112 §6.1 lets a server process such a request by
Transfer-Encoding only if it closes the connection after answering; the front
refuses it instead, as most servers now do: a 400 JSON answer with
``Connection: close``, nothing of the request or what follows it handed to the app,
the connection closed (:meth:`FrontH11Protocol._create_stream`).

h11's own refusals (a malformed request line or header, two different
Content-Length values, a Transfer-Encoding other than ``chunked``, a bad chunk)
are answered by Hypercorn with an empty body; here they carry the JSON error body
of every other refusal, with h11's reason as the message
(:meth:`FrontH11Protocol._send_error_response`). Two more are the front's own,
where h11 is lenient: a chunk-size line with whitespace before its CRLF (h11
accepts it on purpose; RFC 9112 §7.1's grammar has none, and a proxy that frames
it otherwise turns it into smuggling: :class:`ChunkLines`), and a request head
over ``h11_max_incomplete_size`` that arrived whole (h11 bounds only a head still
incomplete; here one limit holds however the bytes arrive, answered 431 as h11
answers the incomplete one). The list is in docs/server.md, "Framings the front
refuses".

A request that asks to close (``Connection: close``, HTTP/1.0 without
keep-alive) and is followed by more bytes (in the same write or later) is
answered, then the connection closes and the rest is discarded (RFC 9112 §9.6; docs/server.md,
"Connections that must close"). Hypercorn's loop hands those bytes to h11, which
raises "Got data when expecting EOF" once the request is read: Hypercorn then
answered 400 in place of the request and closed, cancelling its forward
(pgjones/hypercorn#203 is the same error). :meth:`FrontH11Protocol._handle_events`
is Hypercorn's loop that stops reading there instead.

A refusal that comes once a request's app runs (its body was malformed) is
marked in the request's ``scope["extensions"]`` (:data:`REFUSED_EXTENSION`), so
that the app logs the status the client got, not a 499 for a client that left.

What it relies on, checked by ``tests/server/test_private_hooks.py`` (fails when
the pinned Hypercorn changes any of it):

- ``H11Protocol.__init__``'s arguments (the same as ``ProtocolWrapper``'s, minus
  the ALPN protocol) and its ``connection``, ``send`` and ``client`` attributes;
- ``H11Protocol._handle_events`` (re-implemented here, with the three stops
  above; the rest as Hypercorn's: ``100 Continue``, ``Updated(idle=False)``,
  ``_check_protocol`` then ``_create_stream`` per request, ``Body``/``EndBody``
  to the stream, a break on the body's events while ``stream`` is ``None``,
  ``_send_error_response(status)`` inside ``except h11.RemoteProtocolError``,
  whose reason is read from the exception being handled), and ``handle``
  feeding ``RawData`` to h11 then calling it;
- ``_send_h11_event(event)`` turning an h11 event into ``RawData`` for ``send``.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TYPE_CHECKING, Any

import orjson
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Body, Data, EndBody
from hypercorn.protocol.h11 import STREAM_ID, H11Protocol

from trioforward._h11 import front_h11

if TYPE_CHECKING:
    import h11
else:
    h11 = front_h11()  # the h11 Hypercorn's H11Protocol uses (trioforward._h11)

__all__ = ["REFUSED_EXTENSION", "ChunkLines", "FrontH11Protocol", "ambiguous_framing", "refuse_ambiguous"]

#: ``scope["extensions"]`` key set to the status of the front's refusal of a
#: request whose app already runs (its body was malformed): the app then sees the
#: connection end, and logs that status, not 499, since the client did not leave.
REFUSED_EXTENSION = "trioforward.refused"

log = logging.getLogger("trioforward.server")

FRAMING_MESSAGE = (
    "a request may not carry both Content-Length and Transfer-Encoding "
    "(RFC 9112 section 6.1); the connection is closed"
)
_REASON_LIMIT = 200  # characters of h11's reason kept in the message
_DRAIN_LIMIT = 64 << 20  # bytes of an ambiguous request's body read before answering
_LINE_LIMIT = 4096  # bytes of a chunk-size line checked (h11 bounds longer ones)
_BLANK_LINE = re.compile(b"\n\r?\n")  # the end of a head, as h11 finds it
CHUNK_LINE_MESSAGE = (
    "malformed HTTP/1.1 request: whitespace before the CRLF of a chunk-size line "
    "(RFC 9112 section 7.1)"
)


def ambiguous_framing(headers: object) -> bool:
    """Whether ``headers`` (``(name, value)`` byte pairs, names lower-case as h11
    and Hypercorn give them) carry both ``content-length`` and ``transfer-encoding``."""
    length = coding = False
    for name, _ in headers:  # type: ignore[attr-defined]
        if name == b"content-length":
            length = True
        elif name == b"transfer-encoding":
            coding = True
    return length and coding


def refusal_body(message: str, code: str) -> bytes:
    """The JSON error body of a refusal (docs/server.md, "Errors")."""
    return orjson.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "code": code, "param": None}}
    )


async def refuse_ambiguous(receive: Any, send: Any) -> None:
    """The ASGI app's refusal of an ambiguous framing, under another server than
    ours (whose protocol refuses it before any app runs): a 400 JSON answer with
    ``Connection: close`` on every route, so the server reads nothing after it.
    The body is read first (up to 64 MiB): Hypercorn, meeting the bytes after a
    body it is still reading once a must-close answer has started, closes the
    connection in the middle of that answer."""
    size = 0
    while size <= _DRAIN_LIMIT:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(_AMBIGUOUS)),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": _AMBIGUOUS, "more_body": False})


_AMBIGUOUS = refusal_body(FRAMING_MESSAGE, "ambiguous_framing")
_CHUNK_LINE = refusal_body(CHUNK_LINE_MESSAGE, "malformed_request")


class ChunkLines:
    """The chunk-size lines of one chunked request body, checked as the bytes arrive
    (no I/O). h11 decodes the body; this only refuses what h11 lets through: a line
    ending in a space or tab before its CRLF (RFC 9112 §7.1: ``chunk-size
    [ chunk-ext ] CRLF``, no trailing whitespace; h11's reader allows it).

    :meth:`feed` takes the body's bytes in order, from the first byte after the
    head, and returns ``False`` once a bad line is seen. After the last chunk
    (size 0) it checks nothing more: the trailer section and what follows are h11's.
    """

    __slots__ = ("line", "left", "done")

    def __init__(self) -> None:
        self.line = b""  # the size line read so far
        self.left = 0  # bytes of chunk data (then its CRLF) still to skip
        self.done = False

    def feed(self, data: bytes) -> bool:
        at, end = 0, len(data)
        while at < end and not self.done:
            if self.left:
                step = min(self.left, end - at)
                self.left -= step
                at += step
                continue
            cr = data.find(b"\r\n", at)
            if cr == -1:
                self.line = (self.line + data[at:])[-_LINE_LIMIT:]
                return True
            line = self.line + data[at:cr]
            self.line = b""
            at = cr + 2
            if line[-1:] in (b" ", b"\t"):
                return False
            size = line.partition(b";")[0]
            try:
                self.left = int(size, 16) + 2  # the chunk's data, then its CRLF
            except ValueError:
                self.done = True  # not a size line: h11 refuses it
                return True
            if self.left == 2:
                self.done = True  # the last chunk
        return True


def _chunked(request: h11.Request) -> bool:
    for name, _ in request.headers:
        if name == b"transfer-encoding":
            return True
    return False


class FrontH11Protocol(H11Protocol):
    """Hypercorn's ``H11Protocol`` refusing ambiguous framings with a JSON 400 and
    giving h11's own refusals a JSON body, refusing lenient chunk lines and
    oversized heads, and answering a must-close request whatever follows it
    (module docstring)."""

    _rest_discarded = False  # a must-close request is read: later bytes are dropped
    _chunk_lines: ChunkLines | None = None  # the current request's, while chunked

    async def handle(self, event: Event) -> None:
        if type(event) is RawData:
            if self._rest_discarded:
                return
            lines = self._chunk_lines
            if lines is not None:
                if not lines.feed(event.data):
                    await self._refuse_chunk_line()
                    return
                if lines.done:
                    self._chunk_lines = None
        await super().handle(event)

    async def _handle_events(self) -> None:
        # Hypercorn's H11Protocol._handle_events, stopping at the three places of
        # the module docstring (marked "front:").
        connection = self.connection
        limit = self.config.h11_max_incomplete_size
        while True:
            if connection.they_are_waiting_for_100_continue:
                await self._send_h11_event(
                    h11.InformationalResponse(status_code=100, headers=self.config.response_headers("h11"))
                )
            if connection.their_state is h11.IDLE and not await self._head_fits(limit):
                break  # front: one head limit, however the bytes arrived
            try:
                event = connection.next_event()
            except h11.RemoteProtocolError as error:
                if connection.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
                    await self._send_error_response(error.error_status_hint)
                await self.send(Closed())
                break
            if isinstance(event, h11.Request):
                await self.send(Updated(idle=False))
                if _chunked(event):
                    # front: the chunk lines h11 already holds, before any app runs.
                    lines = ChunkLines()
                    if not lines.feed(connection.trailing_data[0]):
                        await self._refuse_chunk_line()
                        break
                    self._chunk_lines = None if lines.done else lines
                await self._check_protocol(event)
                await self._create_stream(event)
                connection = self.connection  # a WebSocket upgrade wraps it
            elif event is h11.PAUSED:
                await self.can_read.clear()
                await self.can_read.wait()
            elif isinstance(event, h11.ConnectionClosed) or event is h11.NEED_DATA:
                break
            elif self.stream is None:
                break
            elif isinstance(event, h11.Data):
                await self.stream.handle(Body(stream_id=STREAM_ID, data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                await self.stream.handle(EndBody(stream_id=STREAM_ID))
                if connection.their_state is h11.MUST_CLOSE:
                    # front: the request asked to close; it is answered, then the
                    # connection closes (_maybe_recycle), and nothing after it is
                    # read (RFC 9112 §9.6): h11 would raise on those bytes.
                    self._rest_discarded = True
                    break
            elif isinstance(event, Data):
                await self.stream.handle(event)  # WebSocket pass through

    async def _head_fits(self, limit: int) -> bool:
        """Whether the next request head, as far as it has arrived, is within
        ``limit`` bytes (``h11_max_incomplete_size``); refuses it 431 otherwise."""
        buffered = self.connection.trailing_data[0]
        if len(buffered) <= limit:
            return True
        end = _BLANK_LINE.search(buffered, 0, limit + 1)
        if end is not None:
            return True
        log.warning("refused a request head over %d bytes from %s (431, closed)", limit, _client(self.client))
        message = f"malformed HTTP/1.1 request: request head over {limit} bytes"
        await self._refuse(431, refusal_body(message, "malformed_request"))
        await self.send(Closed())
        return False

    async def _refuse_chunk_line(self) -> None:
        self._chunk_lines = None
        self._rest_discarded = True
        log.warning("refused a chunked body from %s: whitespace in a chunk-size line (400, closed)", _client(self.client))
        if self.connection.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
            await self._refuse(400, _CHUNK_LINE)
        await self.send(Closed())

    async def _create_stream(self, request: h11.Request) -> None:
        if ambiguous_framing(request.headers):
            log.warning(
                "refused %s %s from %s: Content-Length and Transfer-Encoding together (400, closed)",
                request.method.decode("latin-1"),
                request.target.decode("latin-1")[:200],
                _client(self.client),
            )
            # No stream: the body and anything after it are never handed on (h11
            # keeps them in its buffer; _handle_events stops at the first body
            # event while there is no stream), and the connection closes.
            await self._refuse(400, _AMBIGUOUS)
            await self.send(Closed())
            return
        await super()._create_stream(request)

    async def _send_error_response(self, status_code: int) -> None:
        # Called by _handle_events inside its ``except h11.RemoteProtocolError``.
        error = sys.exc_info()[1]
        reason = str(error)[:_REASON_LIMIT] if isinstance(error, h11.RemoteProtocolError) else ""
        message = "malformed HTTP/1.1 request" + (f": {reason}" if reason else "")
        await self._refuse(status_code, refusal_body(message, "malformed_request"))

    async def _refuse(self, status: int, body: bytes) -> None:
        scope = getattr(self.stream, "scope", None)  # a request's app already runs
        if isinstance(scope, dict):
            scope["extensions"][REFUSED_EXTENSION] = status
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        await self._send_h11_event(h11.Response(status_code=status, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


def _client(client: tuple[str, int] | None) -> str:
    return "an unknown peer" if client is None else f"{client[0]}:{client[1]}"
