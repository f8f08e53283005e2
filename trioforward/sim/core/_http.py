"""The simulated engine's HTTP/1.1 server side: one h11 connection per task.

The engine (``_engine.SimEngine``) decides what to answer; this module owns the
socket: keep-alive idle expiry, request reading, the response faults
(stall, trickle, close) and client-disconnect detection.

Why a watcher task: vLLM aborts a request when its client connection closes.
While a request waits for capacity or generates, nothing reads the socket, so
an EOF would go unnoticed until the first write. The handler therefore runs in
a nursery beside a task that keeps reading: EOF (or a reset) cancels the
handler and counts ``stats.aborted``; bytes that arrive meanwhile (a pipelined
next request) are fed to h11, which buffers them for the next cycle.
"""

from __future__ import annotations

import math
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from trioforward._h11 import h11

if TYPE_CHECKING:
    from trioforward.sim.engine._engine import SimEngine

__all__ = ["Exchange", "serve_connection", "reset_stream"]

_RECEIVE = 65536
_MAX_BODY = 64 << 20
_CLOSE = (b"connection", b"close")
_EMPTY_HEADERS: list[tuple[bytes, bytes]] = []


def reset_stream(stream: trio.SocketStream) -> None:
    """Close with an RST instead of a FIN (SO_LINGER on, timeout 0)."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


class _Aborted(Exception):
    """The client went away (EOF or reset) before the answer was complete."""


class _Cut(Exception):
    """The ``cut`` fault: the answer was broken off on purpose; close the connection."""


class Exchange:
    """One request/response on a connection: what handlers write to.

    The response-level faults of this request are fixed when it is created
    (``stall_headers``, ``stall_body``, ``trickle``); ``close`` adds
    ``Connection: close``. A non-faulted :meth:`respond` is a single write.
    Writes raise ``_Aborted`` when the client is gone.
    """

    __slots__ = (
        "conn",
        "stream",
        "engine",
        "path",
        "generation",
        "reject",
        "close",
        "stall_headers",
        "stall_body",
        "trickle",
        "cut",
        "status",
        "_first_chunk",
        "_events",
    )

    def __init__(
        self, engine: SimEngine, conn: h11.Connection, stream: trio.SocketStream, path: str
    ) -> None:
        self.engine = engine
        self.conn = conn
        self.stream = stream
        self.path = path
        self.generation = False
        self.reject = False
        self.close = False
        self.stall_headers = self.stall_body = self.trickle = self.cut = False
        self.status = 0
        self._first_chunk = True
        self._events = 0  # complete SSE events sent (for the ``cut`` fault)

    @property
    def slow(self) -> bool:
        """True if writing this answer takes time (a response fault applies)."""
        return self.stall_headers or self.stall_body or self.trickle or self.cut

    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        self.status = status
        self.engine.stats.responses[status] += 1
        if self.close:
            headers.append(_CLOSE)
        return self.conn.send(h11.Response(status_code=status, headers=headers)) or b""

    async def _write(self, data: bytes) -> None:
        try:
            if not self.trickle:
                await self.stream.send_all(data)
                return
            step = max(1, self.engine.faults.trickle_bytes)
            for i in range(0, len(data), step):
                if i:
                    await trio.sleep(self.engine.faults.trickle_interval)
                await self.stream.send_all(data[i : i + step])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise _Aborted from None

    async def _last_write(self, data: bytes) -> None:
        # A generation answered 200 counts as completed *before* its last
        # bytes go out, so a client holding the whole answer always sees
        # stats.completed include it (tests assert right after a response).
        # If that write fails the count is taken back and the driver counts
        # an abort instead.
        counted = self.generation and self.status == 200
        if counted:
            self.engine.stats.completed += 1
            self.engine.stats.changed()
        try:
            await self._write(data)
        except BaseException:  # _Aborted, or Cancelled by the EOF watcher
            if counted:
                self.engine.stats.completed -= 1
                self.engine.stats.changed()
            raise

    async def _stall(self) -> None:
        seconds = self.engine.faults.stall_seconds
        if math.isinf(seconds):
            await trio.sleep_forever()
        await trio.sleep(seconds)

    async def respond(
        self,
        status: int,
        content_type: bytes,
        body: bytes,
        extra: list[tuple[bytes, bytes]] = _EMPTY_HEADERS,
    ) -> None:
        """Send a complete answer (``Content-Length`` framing; ``content_type`` b"" = none)."""
        headers = [(b"content-length", b"%d" % len(body)), *extra]
        if content_type:
            headers.insert(0, (b"content-type", content_type))
        head = self._head(status, headers)
        data = self.conn.send(h11.Data(data=body)) or b"" if body else b""
        tail = self.conn.send(h11.EndOfMessage()) or b""
        if self.cut:
            await self._write(head + data[: self.engine.faults.cut_bytes])
            raise _Cut
        if self.stall_headers:
            await self._write(head)
            await self._stall()
            await self._last_write(data + tail)
        elif self.stall_body:
            half = len(data) // 2
            await self._write(head + data[:half])
            await self._stall()
            await self._last_write(data[half:] + tail)
        else:
            await self._last_write(head + data + tail)

    async def start_stream(self, status: int, content_type: bytes) -> None:
        """Send the headers of a chunked answer (Transfer-Encoding: chunked)."""
        head = self._head(
            status, [(b"content-type", content_type), (b"cache-control", b"no-cache")]
        )
        await self._write(head)
        if self.stall_headers:
            await self._stall()

    async def send_chunk(self, data: bytes, last: bool = False) -> None:
        """Send one body chunk of a streamed answer (``last``: and end the answer)."""
        if self.cut:
            await self._cut_chunk(data)
        framed = self.conn.send(h11.Data(data=data)) or b""
        if self.stall_body and self._first_chunk:
            half = len(framed) // 2
            await self._write(framed[:half])
            await self._stall()
            framed = framed[half:]
        self._first_chunk = False
        if last:
            await self._last_write(framed + (self.conn.send(h11.EndOfMessage()) or b""))
        else:
            await self._write(framed)

    async def _cut_chunk(self, data: bytes) -> None:
        """The ``cut`` fault: if the cut falls in ``data``, send what comes before it
        (a well-framed chunk holding the last events and a fragment) and raise
        :class:`_Cut`; otherwise count the events and return."""
        faults = self.engine.faults
        at = 0
        while self._events < faults.cut_events:
            end = data.find(b"\n\n", at)
            if end < 0:
                return
            self._events += 1
            at = end + 2
        if at >= len(data):
            return  # the events end with this chunk: the fragment is the next one's
        await self._write(self.conn.send(h11.Data(data=data[: at + faults.cut_bytes])) or b"")
        raise _Cut

    async def end_stream(self, final: bytes = b"") -> None:
        """Send the last chunk ``final`` (if any) and finish a streamed answer, in one write."""
        if final:
            await self.send_chunk(final, last=True)
        else:
            await self._last_write(self.conn.send(h11.EndOfMessage()) or b"")


async def _receive(stream: trio.SocketStream) -> bytes:
    try:
        return await stream.receive_some(_RECEIVE)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""


async def _read_request(
    engine: SimEngine, conn: h11.Connection, stream: trio.SocketStream
) -> tuple[h11.Request, bytes] | None:
    """The next request and its body; None when the connection should close.

    Only the wait for the first byte of a request is bounded by the keep-alive
    idle timeout (uvicorn's ``timeout_keep_alive``, which vLLM leaves at 5 s).
    """
    request: h11.Request | None = None
    body: list[bytes] = []
    size = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            if conn.they_are_waiting_for_100_continue:  # curl sends Expect for bodies > 1 KiB
                data = conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                try:
                    await stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return None
            if request is None and conn.their_state is h11.IDLE:
                with trio.move_on_after(engine.keep_alive):
                    conn.receive_data(await _receive(stream))
                    continue
                engine.stats.keep_alive_closed += 1
                engine.stats.changed()
                return None
            conn.receive_data(await _receive(stream))
        elif type(event) is h11.Request:
            request = event
        elif type(event) is h11.Data:
            size += len(event.data)
            if size > _MAX_BODY:
                raise h11.RemoteProtocolError("request body too large", error_status_hint=413)
            body.append(event.data)
        elif type(event) is h11.EndOfMessage:
            assert request is not None
            return request, b"".join(body)
        else:  # ConnectionClosed, PAUSED
            return None


async def _watched(
    stream: trio.SocketStream, conn: h11.Connection, handler: Awaitable[None]
) -> None:
    """Run ``handler`` while reading the socket; raise ``_Aborted`` on EOF/reset."""
    aborted = cut = False

    async def watch(cancel: trio.CancelScope) -> None:
        nonlocal aborted
        while data := await _receive(stream):
            conn.receive_data(data)
        aborted = True
        cancel.cancel()

    finished = False
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        try:
            await handler
            # The whole answer was written: an EOF seen meanwhile is the
            # client closing after reading it, not an abort.
            finished = True
        except _Aborted:
            aborted = True
        except _Cut:
            cut = True
        nursery.cancel_scope.cancel()
    if cut:
        raise _Cut
    if aborted and not finished:
        raise _Aborted


async def serve_connection(
    engine: SimEngine,
    stream: trio.SocketStream,
    handle: Callable[[Exchange, h11.Request, bytes], Awaitable[None]],
) -> None:
    """Serve HTTP/1.1 requests on ``stream`` until either side closes it.

    ``handle(exchange, request, body)`` answers one request through the
    exchange. Cancellation (engine stop) closes the socket at once.
    """
    stats, faults = engine.stats, engine.faults
    stats.connections_accepted += 1
    stats.connections_open += 1
    stats.changed()
    conn = h11.Connection(h11.SERVER)
    answered = 0
    try:
        async with stream:
            while True:
                try:
                    got = await _read_request(engine, conn, stream)
                except h11.RemoteProtocolError as exc:
                    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        status = exc.error_status_hint
                        body = b'{"detail":"%s"}' % str(exc).encode()
                        ex = Exchange(engine, conn, stream, "")
                        ex.close = True
                        try:
                            await ex.respond(status, b"application/json", body)
                        except _Aborted:
                            pass
                    return
                if got is None:
                    return
                request, body = got
                path = request.target.partition(b"?")[0].decode("latin-1")
                ex = Exchange(engine, conn, stream, path)
                generation = ex.generation = path in engine.generation_paths
                if generation:
                    for name, value in request.headers:
                        if name == b"traceparent":
                            stats.traced(value)
                if not path.startswith("/sim/"):
                    stats.requests += 1
                    stats.by_path[path] += 1
                    stats.changed()
                    if path in faults.paths:
                        if _take(engine, "drop"):
                            return
                        if _take(engine, "reject"):
                            ex.reject = True
                            stats.rejected += 1
                        ex.stall_headers = _take(engine, "stall_headers")
                        ex.stall_body = _take(engine, "stall_body")
                        ex.trickle = _take(engine, "trickle")
                        ex.cut = _take(engine, "cut")
                ex.close = faults.connection_close
                try:
                    if ex.slow or (generation and not engine.instant):
                        await _watched(stream, conn, handle(ex, request, body))
                    else:
                        await handle(ex, request, body)
                except _Cut:
                    return  # the connection closes with the answer broken off
                except _Aborted:
                    if generation:
                        stats.aborted += 1
                        stats.changed()
                    return
                answered += 1
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                if faults.close_every and answered % faults.close_every == 0:
                    stats.faults["close_every"] += 1
                    stats.changed()
                    return
                conn.start_next_cycle()
    finally:
        stats.connections_open -= 1
        stats.changed()


def _take(engine: SimEngine, name: str) -> bool:
    if engine.faults.take(name):
        engine.stats.faults[name] += 1
        engine.stats.changed()
        return True
    return False
