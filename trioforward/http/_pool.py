"""The connection pool: per-origin idle deques, slots and FIFO waiters.

Bookkeeping is by counters and per-origin deques, never by scanning (DESIGN §3):

- ``origin.idle`` is a deque of parked connections, oldest on the left. Release
  appends on the right; checkout pops on the right (newest first: the one least
  likely to have been closed by the engine's keep-alive timer); expiry pops on
  the left. Every connection is pushed and popped once per request, so acquire
  and release are O(1) (amortized for expiry).
- A *slot* is a token held by the task driving a connection, from the moment
  it decides to reuse or connect until it parks or closes the connection.
  ``origin.held`` counts them; with ``max_connections`` reached, a task parks
  in ``origin.lot`` (FIFO). A release with waiters hands its slot directly to
  the first waiter (``held`` unchanged) instead of waking everybody.
- Invariant: ``held + len(idle) <= max_connections``. A slot holder only opens
  a connection when the idle deque is empty, and a release moves a connection
  from held to idle.

No locks: in trio the code between two checkpoints is atomic, and every
mutation of the bookkeeping here happens between checkpoints.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h11
import trio

from trioforward.http._connection import (
    _ONE_WRITE,
    RECEIVE_SIZE,
    Connection,
    header_list,
)
from trioforward.http._errors import Phase
from trioforward.http._models import PoolStatistics, Response, Target, parse_target
from trioforward.http._phases import Attempt

__all__ = ["ConnectionPool", "open_pool"]

_inf = math.inf
_read = os.read
_write = os.write
_wait_readable = trio.lowlevel.wait_readable
_NO_HEADERS: list[tuple[bytes, bytes]] = []
_current_time = trio.current_time
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_NEED_DATA = h11.NEED_DATA
_Data = h11.Data
_Response = h11.Response
_EndOfMessage = h11.EndOfMessage
_InformationalResponse = h11.InformationalResponse
_SEND = Phase.SEND
_AWAIT_HEADERS = Phase.AWAIT_HEADERS
_READ_BODY = Phase.READ_BODY
_MAX_TARGETS = 4096  # parsed-URL cache entries before the cache is dropped
_METHODS: dict[str | bytes, bytes] = {
    m: m.encode("ascii") for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "PATCH")
}
_METHODS.update({m: m for m in list(_METHODS.values())})
_Headers = list[tuple[str | bytes, str | bytes]] | None


class _Origin:
    """Per ``http://host:port`` state. ``spec`` is the ``(scheme, host, port)`` errors carry."""

    __slots__ = ("key", "host", "port", "spec", "idle", "lot", "held")

    def __init__(self, target: Target) -> None:
        self.key = target.key
        self.host = target.host
        self.port = target.port
        self.spec = ("http", target.host, target.port)
        self.idle: deque[Connection] = deque()
        self.lot = trio.lowlevel.ParkingLot()
        self.held = 0


class ConnectionPool:
    """HTTP/1.1 keep-alive connections to many origins. Create with :func:`open_pool`.

    ``max_connections`` is per origin (``0`` = unlimited); ``idle_expiry`` (s)
    is the longest a parked connection is trusted; ``connect_timeout`` (s,
    ``None`` = none) bounds each TCP connect. Not thread-safe; use from one
    trio run.
    """

    def __init__(
        self,
        *,
        max_connections: int = 0,
        idle_expiry: float = 4.0,
        connect_timeout: float | None = 60.0,
    ) -> None:
        if max_connections < 0:
            raise ValueError("max_connections must be >= 0 (0 = unlimited)")
        self._limit = max_connections
        self._idle_expiry = idle_expiry
        self._connect_timeout = connect_timeout
        self._origins: dict[str, _Origin] = {}
        self._targets: dict[str, tuple[Target, _Origin]] = {}
        self._idle = 0
        self._active = 0
        self._connecting = 0
        self._waiting = 0
        self._opened_total = 0
        self._reused_total = 0
        self._closed_total = 0

    # -- public API -----------------------------------------------------------

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot of the counters, summed over origins (O(1))."""
        return PoolStatistics(
            idle=self._idle,
            active=self._active,
            connecting=self._connecting,
            waiting=self._waiting,
            opened_total=self._opened_total,
            reused_total=self._reused_total,
            closed_total=self._closed_total,
        )

    def close_idle(self, origin: str | None = None) -> None:
        """Close the idle connections of every origin, or of one ``"http://host:port"``.

        Connections in use are not touched (they close or park when their
        request ends). An unknown origin is a no-op.
        """
        if origin is None:
            origins = list(self._origins.values())
        else:
            known = self._origins.get(parse_target(origin).key)
            origins = [known] if known is not None else []
        for o in origins:
            while o.idle:
                self._discard_idle(o.idle.pop())

    async def request(
        self,
        method: str | bytes,
        url: str,
        *,
        headers: _Headers = None,
        content: bytes = b"",
        deadline: float = _inf,
        read_timeout: float | None = None,
    ) -> Response:
        """Send one request and read the whole response.

        Args:
            method: ``"POST"``, ``b"GET"``, ...
            url: ``http://host:port/path?query``.
            headers: extra request headers; ``Host`` and ``Content-Length`` are
                added by the pool (do not pass them).
            content: the request body.
            deadline: absolute ``trio.current_time()``; past it raises
                :class:`PoolTimeout` with the phase it was in
                (:class:`ConnectTimeout` while waiting for a slot or connecting).
            read_timeout: longest silence (s) between body bytes, else
                :class:`PoolTimeout` in READ_BODY.

        Returns a :class:`Response` (any status). Raises :class:`PoolError`
        subclasses with ``.phase``, ``.reused``, ``.response_bytes``;
        ``ValueError`` for a bad URL or header. On cancellation the connection
        is closed and ``trio.Cancelled`` propagates.
        """
        target, origin = self._lookup(url)
        await _checkpoint_if_cancelled()
        conn = await self._acquire(origin, deadline)
        # The attempt's facts live in locals (see Attempt): phase, reused, received.
        reused = conn.requests > 0
        phase = _SEND
        received = 0
        try:
            head, body = conn.request_bytes(
                _METHODS.get(method) or _as_bytes(method),
                target.path,
                target.host_header,
                headers,
                content,
            )
            fd = conn.fd
            if len(body) <= _ONE_WRITE:
                data = head + body if body else head
                try:
                    sent = _write(fd, data)
                except BlockingIOError:
                    sent = 0
                if sent != len(data):
                    attempt = Attempt(origin.spec, _SEND, reused)
                    await conn.send_rest(data, sent, deadline, attempt)
            else:
                await conn.send(head, body, deadline, Attempt(origin.spec, _SEND, reused))
            phase = _AWAIT_HEADERS
            h = conn.h11
            next_event = h.next_event
            status = 0
            response_headers: list[tuple[bytes, bytes]] = _NO_HEADERS
            content_out: bytes | bytearray = b""
            more: list[bytes | bytearray] | None = None
            just_sent = True
            while True:
                event = next_event()
                if event is _NEED_DATA:
                    # Read first unless nothing can be there yet; wait only if empty.
                    got: bytes | None = None
                    if not just_sent:
                        try:
                            got = _read(fd, RECEIVE_SIZE)
                        except BlockingIOError:
                            pass
                    just_sent = False
                    while got is None:
                        if read_timeout is None or phase is not _READ_BODY:
                            limit, what = deadline, "deadline"
                        else:
                            limit, what = _current_time() + read_timeout, "read_timeout"
                            if deadline < limit:
                                limit, what = deadline, "deadline"
                        if limit == _inf:
                            await _wait_readable(fd)
                        else:
                            # Inline, not a helper coroutine: whatever is alive
                            # across this await, times thousands of requests in
                            # flight, is what the garbage collector walks.
                            with trio.CancelScope(deadline=limit) as scope:
                                await _wait_readable(fd)
                            if scope.cancelled_caught:
                                raise Attempt(origin.spec, phase, reused, received).timeout(what)
                        try:
                            got = _read(fd, RECEIVE_SIZE)
                        except BlockingIOError:
                            pass
                    received += len(got)
                    h.receive_data(got)
                    continue
                kind = type(event)
                if kind is _Data:
                    if more is not None:
                        more.append(event.data)  # type: ignore[union-attr]
                    elif content_out:
                        more = [content_out, event.data]  # type: ignore[union-attr]
                    else:
                        content_out = event.data  # type: ignore[union-attr]
                elif kind is _Response:
                    status = event.status_code  # type: ignore[union-attr]
                    response_headers = header_list(event.headers)  # type: ignore[union-attr]
                    phase = _READ_BODY
                elif kind is _EndOfMessage:
                    break
                elif kind is not _InformationalResponse:  # ConnectionClosed
                    raise Attempt(origin.spec, phase, reused, received).closed()
        except BaseException as exc:
            self._release(origin, conn, False)
            if isinstance(exc, OSError | h11.ProtocolError):
                raise Attempt(origin.spec, phase, reused, received).failure(exc) from exc
            raise
        self._finish(origin, conn)
        if more is not None:
            content_out = b"".join(more)
        return Response(
            status,
            response_headers,
            content_out if type(content_out) is bytes else bytes(content_out),
            reused,
        )

    def stream(
        self,
        method: str | bytes,
        url: str,
        *,
        headers: _Headers = None,
        content: bytes = b"",
        deadline: float = _inf,
        read_timeout: float | None = None,
    ) -> StreamContext:
        """``async with pool.stream(...) as response:`` — same arguments as :meth:`request`.

        Entering sends the request and reads up to the headers; the body is
        read with ``response.aiter_bytes()``. Leaving the block before the body
        is complete closes the connection (never reused).
        """
        target, origin = self._lookup(url)
        return StreamContext(
            self,
            origin,
            target,
            _METHODS.get(method) or _as_bytes(method),
            headers,
            content,
            deadline,
            read_timeout,
        )

    # -- slots and idle deques ------------------------------------------------

    def _lookup(self, url: str) -> tuple[Target, _Origin]:
        hit = self._targets.get(url)
        if hit is None:
            target = parse_target(url)
            origin = self._origins.get(target.key)
            if origin is None:
                origin = self._origins[target.key] = _Origin(target)
            if len(self._targets) >= _MAX_TARGETS:
                self._targets.clear()
            hit = self._targets[url] = (target, origin)
        return hit

    async def _acquire(self, origin: _Origin, deadline: float) -> Connection:
        """Take a slot, then the newest live idle connection or a new one.

        On any exception (timeout, connect failure, cancellation) the slot is
        given back and no socket stays open.
        """
        if self._limit and origin.held >= self._limit:
            await self._wait_for_slot(origin, deadline)  # the slot is handed to us
        else:
            origin.held += 1
        idle = origin.idle
        if idle:
            now = _current_time()
            while idle:
                conn = idle.pop()
                self._idle -= 1
                if now - conn.idle_since >= self._idle_expiry:
                    # The newest is too old, so all of them are.
                    self._close(conn)
                    while idle:
                        self._discard_idle(idle.popleft())
                    break
                if conn.is_readable():  # closed by the engine, or junk: never reuse
                    self._close(conn)
                    continue
                self._active += 1
                self._reused_total += 1
                return conn
        self._connecting += 1
        try:
            conn = await self._connect(origin, deadline)
        except BaseException:
            self._connecting -= 1
            self._release_slot(origin)
            raise
        self._connecting -= 1
        self._active += 1
        self._opened_total += 1
        return conn

    async def _wait_for_slot(self, origin: _Origin, deadline: float) -> None:
        self._waiting += 1
        try:
            if deadline == _inf:
                await origin.lot.park()
                return
            with trio.CancelScope(deadline=deadline) as scope:
                await origin.lot.park()
            # If park() returned, the slot is ours even when the deadline passed too.
            if scope.cancelled_caught:
                raise Attempt(origin.spec).timeout("deadline (waiting for a connection slot)")
        finally:
            self._waiting -= 1

    async def _connect(self, origin: _Origin, deadline: float) -> Connection:
        """``trio.open_tcp_stream`` in the caller's own scope.

        trio closes every socket it opened if the connect fails or is
        cancelled, so nothing is left to clean up here.
        """
        limit, what = deadline, "deadline"
        if self._connect_timeout is not None:
            bound = _current_time() + self._connect_timeout
            if bound < limit:
                limit, what = bound, "connect_timeout"
        try:
            if limit == _inf:
                stream = await trio.open_tcp_stream(origin.host, origin.port)
                return Connection(stream)
            with trio.CancelScope(deadline=limit) as scope:
                stream = await trio.open_tcp_stream(origin.host, origin.port)
                return Connection(stream)
            assert scope.cancelled_caught
            raise Attempt(origin.spec).timeout(what)
        except OSError as exc:
            raise Attempt(origin.spec).failure(exc) from exc

    def _finish(self, origin: _Origin, conn: Connection) -> None:
        """The response was read to the end: park the connection if h11 allows."""
        h = conn.h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
            conn.requests += 1
            self._release(origin, conn, True)
        else:
            self._release(origin, conn, False)

    def _release(self, origin: _Origin, conn: Connection, reusable: bool) -> None:
        """End of a request: park (``reusable``) or close, then pass the slot on."""
        self._active -= 1
        if reusable:
            now = conn.idle_since = _current_time()
            idle = origin.idle
            idle.append(conn)
            self._idle += 1
            # Expire from the left: only the oldest can be stale, stop at the first fresh one.
            horizon = now - self._idle_expiry
            while idle and idle[0].idle_since <= horizon:
                self._discard_idle(idle.popleft())
        else:
            self._close(conn)
        self._release_slot(origin)

    def _release_slot(self, origin: _Origin) -> None:
        if origin.lot:
            origin.lot.unpark()  # direct hand-off: ``held`` stays, the first waiter owns it
        else:
            origin.held -= 1

    def _discard_idle(self, conn: Connection) -> None:
        self._idle -= 1
        self._close(conn)

    def _close(self, conn: Connection) -> None:
        conn.close()
        self._closed_total += 1


def _as_bytes(method: str | bytes) -> bytes:
    return method if isinstance(method, bytes) else method.encode("ascii")


@asynccontextmanager
async def open_pool(
    *,
    max_connections: int = 0,
    idle_expiry: float = 4.0,
    connect_timeout: float | None = 60.0,
) -> AsyncIterator[ConnectionPool]:
    """``async with open_pool(...) as pool:`` — a :class:`ConnectionPool` whose idle
    connections are closed when the block exits. Arguments as :class:`ConnectionPool`.
    """
    pool = ConnectionPool(
        max_connections=max_connections,
        idle_expiry=idle_expiry,
        connect_timeout=connect_timeout,
    )
    try:
        yield pool
    finally:
        pool.close_idle()


from trioforward.http._stream import StreamContext  # noqa: E402  (cycle: the stream drives the pool)
