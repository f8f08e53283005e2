"""A tiny trio + h11 HTTP/1.1 server for the pool tests (imported as `pool_testing`:
tests/ has no __init__.py, so pytest puts this folder on sys.path).

Each test passes a *handler* ``async def handler(ex: Exchange) -> None`` that
decides what happens to one request: a normal answer, a ``Connection: close``,
a chunked body, a stall, a close after some bytes, a reset. The server counts
what it saw so tests assert engine-side facts (connections accepted, requests
received, connections closed), and ``wait_until`` lets a test await a count
instead of sleeping.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import h11
import trio

from trioforward.http import ConnectionPool

Handler = Callable[["Exchange"], Awaitable[None]]


@dataclass
class Exchange:
    """One request as the server saw it, plus ways to answer it."""

    server: TestServer
    stream: trio.SocketStream
    conn: h11.Connection
    request: h11.Request
    body: bytes
    connection_index: int  # 0-based, in accept order
    request_index: int  # 0-based, per connection
    hard_closed: bool = field(default=False)

    async def respond(
        self,
        status: int = 200,
        body: bytes = b"",
        headers: Sequence[tuple[bytes, bytes]] = (),
        *,
        chunked: bool = False,
        close: bool = False,
    ) -> None:
        """A complete response (content-length or chunked framing)."""
        fields = list(headers)
        if close:
            fields.append((b"connection", b"close"))
        if chunked:
            fields.append((b"transfer-encoding", b"chunked"))
        else:
            fields.append((b"content-length", b"%d" % len(body)))
        await self.send(h11.Response(status_code=status, headers=fields))
        if chunked:
            for start in range(0, len(body), 7):  # several small chunks on purpose
                await self.send(h11.Data(data=body[start : start + 7]))
        elif body:
            for start in range(0, len(body), 1 << 20):
                await self.send(h11.Data(data=body[start : start + (1 << 20)]))
        await self.send(h11.EndOfMessage())

    async def send(self, event: h11._events.Event) -> None:
        data = self.conn.send(event)
        if data:
            await self.stream.send_all(data)

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def wait_client_hangup(self) -> None:
        """Stall (send nothing) until the client closes the connection, like an
        engine that notices the disconnect and aborts the generation."""
        try:
            while await self.stream.receive_some(65536):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.hard_closed = True

    async def close(self) -> None:
        """Close the connection now (FIN)."""
        self.hard_closed = True
        await self.stream.aclose()

    async def reset(self) -> None:
        """Close with SO_LINGER 0 (RST instead of FIN)."""
        self.hard_closed = True
        self.stream.socket.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        await self.stream.aclose()


async def ok_handler(ex: Exchange) -> None:
    """Echo the request body back (or b"ok")."""
    await ex.respond(200, ex.body or b"ok", [(b"content-type", b"text/plain")])


class TestServer:
    """Listens on 127.0.0.1:port. ``url`` is ``http://127.0.0.1:PORT``."""

    __test__ = False  # not a pytest class

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.port = 0
        self.accepted = 0
        self.closed = 0
        self.requests: list[Exchange] = []
        self._idle: dict[int, trio.CancelScope] = {}
        self._changed = trio.Event()
        self.reset_on_close = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds (re-checked after every server event)."""
        while not predicate():
            await self._changed.wait()

    async def close_idle(self, expected: int = 1, *, reset: bool = False) -> None:
        """Close, from the server side, ``expected`` connections that wait for their
        next request, once that many do; ``reset``: with RST instead of FIN.
        Returns after they are closed.
        """
        await self.wait_until(lambda: len(self._idle) >= expected)
        self.reset_on_close = reset
        target = self.closed + len(self._idle)
        for scope in list(self._idle.values()):
            scope.cancel()
        await self.wait_until(lambda: self.closed >= target)

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        index = self.accepted
        self.accepted += 1
        self._notify()
        conn = h11.Connection(h11.SERVER)
        served = 0
        try:
            while True:
                with trio.CancelScope() as idle_scope:
                    if served:
                        self._idle[index] = idle_scope
                        self._notify()
                    try:
                        request, body = await _read_request(stream, conn)
                    finally:
                        self._idle.pop(index, None)
                if idle_scope.cancelled_caught or request is None:
                    return
                ex = Exchange(self, stream, conn, request, body, index, served)
                self.requests.append(ex)
                self._notify()
                await self.handler(ex)
                served += 1
                if ex.hard_closed or conn.our_state is not h11.DONE:
                    return
                if conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            if self.reset_on_close:
                stream.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            with trio.CancelScope(shield=True):
                await stream.aclose()
            self.closed += 1
            self._notify()


async def _read_request(
    stream: trio.SocketStream, conn: h11.Connection
) -> tuple[h11.Request | None, bytes]:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            return None, b""


@asynccontextmanager
async def open_server(handler: Handler = ok_handler) -> AsyncIterator[TestServer]:
    """Serve ``handler`` on an ephemeral loopback port for the block's duration."""
    server = TestServer(handler)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, server.serve_connection, 0, host="127.0.0.1")
        )
        server.port = listeners[0].socket.getsockname()[1]
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def full_backlog_listener() -> AsyncIterator[str]:
    """A loopback port whose accept queue is full and never drained: a connect to
    it hangs in CONNECT (Linux drops the SYN while the queue is full).
    Yields its ``http://127.0.0.1:PORT`` URL.
    """
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(4):  # more than the queue holds; extra SYNs just stay pending
            filler = socket.socket()
            filler.setblocking(False)
            try:
                filler.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(filler)
        yield f"http://127.0.0.1:{port}"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def assert_quiet(pool: ConnectionPool) -> None:
    """Nothing in flight: no active, connecting or waiting request."""
    stats = pool.statistics()
    assert (stats.active, stats.connecting, stats.waiting) == (0, 0, 0), stats
