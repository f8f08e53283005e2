"""The connection pool's public face: ``open_pool``, ``request`` and ``stream``.

``request`` is the hot path measured in docs/performance.md. It keeps the
attempt's facts (phase, reused, bytes received) in local variables and builds an
:class:`Attempt` only to raise, does one ``write`` for headers and a small body,
and waits with ``trio.lowlevel.wait_readable`` directly; the bookkeeping it
calls (:mod:`trioforward.http._slots`) is O(1).
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from trioforward._h11 import h11
from trioforward.http._connection import _ONE_WRITE, RECEIVE_SIZE
from trioforward.http._errors import Phase
from trioforward.http._h11_hooks import header_list
from trioforward.http._models import PoolStatistics, Response
from trioforward.http._phases import Attempt, PhaseSink
from trioforward.http._slots import OriginSlots
from trioforward.http._stream import StreamContext

__all__ = ["ConnectionPool", "open_pool", "PhaseSink"]

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
_METHODS: dict[str | bytes, bytes] = {
    m: m.encode("ascii") for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "PATCH")
}
_METHODS.update({m: m for m in list(_METHODS.values())})
_Headers = list[tuple[str | bytes, str | bytes]] | None


class ConnectionPool:
    """HTTP/1.1 keep-alive connections to many origins. Create with :func:`open_pool`.

    ``ConnectionPool(max_connections=0, idle_expiry=4.0, connect_timeout=60.0)``:
    ``max_connections`` is per origin (``0`` = unlimited); ``idle_expiry`` (s)
    is the longest a parked connection is trusted; ``connect_timeout`` (s,
    ``None`` = none) bounds each TCP connect. Not thread-safe; use from one
    trio run. The slot bookkeeping lives in :class:`~trioforward.http._slots.OriginSlots`.
    """

    __slots__ = ("_slots",)

    def __init__(
        self,
        *,
        max_connections: int = 0,
        idle_expiry: float = 4.0,
        connect_timeout: float | None = 60.0,
    ) -> None:
        self._slots = OriginSlots(
            max_connections=max_connections,
            idle_expiry=idle_expiry,
            connect_timeout=connect_timeout,
        )

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot of the counters, summed over origins (O(1))."""
        return self._slots.statistics()

    def close_idle(self, origin: str | None = None) -> None:
        """Close the idle connections of every origin, or of one ``"http://host:port"``.

        Connections in use are not touched (they close or park when their
        request ends). An unknown origin is a no-op.
        """
        self._slots.close_idle(origin)

    async def request(
        self,
        method: str | bytes,
        url: str,
        *,
        headers: _Headers = None,
        content: bytes = b"",
        deadline: float = _inf,
        read_timeout: float | None = None,
        progress: PhaseSink | None = None,
        extend: Callable[[], float] | None = None,
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
            progress: if given, its ``phase`` is set to the phase the attempt
                was in when it ended by cancellation (a :class:`PoolError`
                carries its own ``.phase``); untouched while still in CONNECT.
            extend: asked, when ``deadline`` passes while waiting for response
                bytes, for the deadline now in force; a later one is waited
                for instead of failing (a request frozen on a paused engine:
                docs/operations.md). Asked too when ``read_timeout`` fires: a
                later deadline means the request was frozen since the deadline
                last moved, so the silence restarts (a full ``read_timeout``)
                instead of failing. Called only then: nothing on the fast path.

        Returns a :class:`Response` (any status). Raises :class:`PoolError`
        subclasses with ``.phase``, ``.reused``, ``.response_bytes``;
        ``ValueError`` for a bad URL or header. On cancellation the connection
        is closed and ``trio.Cancelled`` propagates.
        """
        slots = self._slots
        target, origin = slots.lookup(url)
        await _checkpoint_if_cancelled()
        conn = await slots.checkout(origin, deadline)
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
                                if extend is not None:
                                    later = extend()
                                    if later > deadline:  # frozen meanwhile: wait on
                                        deadline = later
                                        continue
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
            slots.discard(origin, conn)
            if isinstance(exc, OSError | h11.ProtocolError):
                raise Attempt(origin.spec, phase, reused, received).failure(exc) from exc
            if progress is not None:
                # Cancelled (or a bug): only the caller's record can say how far it got.
                progress.phase = phase
            raise
        slots.checkin(origin, conn)
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
        progress: PhaseSink | None = None,
        extend: Callable[[], float] | None = None,
    ) -> StreamContext:
        """``async with pool.stream(...) as response:`` — same arguments as :meth:`request`.

        Entering sends the request and reads up to the headers; the body is
        read with ``response.aiter_bytes()``. Leaving the block before the body
        is complete closes the connection (never reused).
        """
        target, origin = self._slots.lookup(url)
        return StreamContext(
            self._slots,
            origin,
            target,
            _METHODS.get(method) or _as_bytes(method),
            headers,
            content,
            deadline,
            read_timeout,
            progress,
            extend,
        )


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
        pool._slots.close()
