"""Streamed responses: ``async with pool.stream(...) as response``."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING

import trio

from trioforward._h11 import h11
from trioforward.http._connection import Connection
from trioforward.http._errors import Phase, PoolTimeout
from trioforward.http._h11_hooks import header_list
from trioforward.http._models import Target
from trioforward.http._phases import Attempt, PhaseSink

if TYPE_CHECKING:
    from trioforward.http._slots import OriginSlots, _Origin

__all__ = ["StreamContext", "StreamResponse"]

_Headers = list[tuple[str | bytes, str | bytes]] | None


class StreamResponse:
    """Status and headers of a response whose body is read incrementally.

    Attributes:
        status: the status code.
        headers: ``[(name, value), ...]`` bytes, names lower-cased.
        reused: ``True`` if the connection had served a request before.
        complete: ``True`` once the body has been read to its end.
    """

    __slots__ = ("status", "headers", "reused", "complete", "_ctx")

    def __init__(
        self, status: int, headers: list[tuple[bytes, bytes]], reused: bool, ctx: StreamContext
    ) -> None:
        self.status = status
        self.headers = headers
        self.reused = reused
        self.complete = False
        self._ctx = ctx

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """Yield the body as it arrives (chunked framing removed), in pieces of up
        to 64 KiB. Raises :class:`RemoteProtocolError` or :class:`PoolTimeout`
        (phase READ_BODY) if the engine breaks off or stays silent past
        ``read_timeout``/``deadline``.
        """
        ctx = self._ctx
        conn = ctx.conn
        if conn is None or self.complete:
            return
        h = conn.h11
        attempt = ctx.attempt
        while True:
            try:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    try:
                        data = await conn.receive(ctx.deadline, ctx.read_timeout, attempt, False)
                    except PoolTimeout:
                        if ctx.extended():
                            continue
                        raise
                    attempt.response_bytes += len(data)
                    h.receive_data(data)
                    continue
            except BaseException as exc:
                ctx.abandon()
                if isinstance(exc, OSError | h11.ProtocolError):
                    raise attempt.failure(exc) from exc
                raise
            kind = type(event)
            if kind is h11.Data:
                yield bytes(event.data)  # type: ignore[union-attr]
            elif kind is h11.EndOfMessage:
                self.complete = True
                return
            else:  # ConnectionClosed mid-body
                ctx.abandon()
                raise attempt.closed()

    async def aread(self) -> bytes:
        """The rest of the body as one ``bytes``."""
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    def close(self) -> None:
        """Give the connection back: parked if the body was read to its end, else
        closed (the engine aborts). Idempotent; what leaving the ``async with`` does."""
        self._ctx.close(self.complete)

    def cut(self) -> None:
        """End the body early, from any task: the connection is shut down both ways
        (``shutdown(2)``: the engine sees its client leave and aborts), so a read in
        progress or the next one ends as if the engine had closed it (raises
        :class:`RemoteProtocolError`, phase READ_BODY). The socket itself is closed
        by :meth:`close`, by the task reading it (closing a descriptor another task
        waits on is not allowed in trio). Idempotent; nothing if already complete."""
        conn = self._ctx.conn
        if conn is None or self.complete:
            return
        try:
            conn.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone


class StreamContext:
    """What :meth:`ConnectionPool.stream` returns; see there."""

    __slots__ = (
        "slots",
        "origin",
        "target",
        "method",
        "headers",
        "content",
        "deadline",
        "read_timeout",
        "extend",
        "attempt",
        "conn",
        "response",
        "progress",
    )

    def __init__(
        self,
        slots: OriginSlots,
        origin: _Origin,
        target: Target,
        method: bytes,
        headers: _Headers,
        content: bytes,
        deadline: float,
        read_timeout: float | None,
        progress: PhaseSink | None = None,
        extend: Callable[[], float] | None = None,
    ) -> None:
        self.slots = slots
        self.origin = origin
        self.target = target
        self.method = method
        self.headers = headers
        self.content = content
        self.deadline = deadline
        self.read_timeout = read_timeout
        self.extend = extend
        self.attempt = Attempt(origin.spec)
        self.conn: Connection | None = None
        self.response: StreamResponse | None = None
        self.progress = progress

    def extended(self) -> bool:
        """After a timeout (the deadline or ``read_timeout``): True if ``extend``
        moved the deadline later (see :meth:`ConnectionPool.request`), so the wait
        goes on (a silence restarts with a full ``read_timeout``)."""
        if self.extend is None:
            return False
        later = self.extend()
        if later <= self.deadline:
            return False
        self.deadline = later
        return True

    def abandon(self) -> None:
        """Close the connection and give its slot back (idempotent)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            self.slots.discard(self.origin, conn)

    async def __aenter__(self) -> StreamResponse:
        return await self.open()

    async def open(self) -> StreamResponse:
        """Send the request and read up to the headers (what entering the block does).

        The caller must :meth:`StreamResponse.close` the response it gets; on
        any exception here the connection is already closed.
        """
        attempt, deadline = self.attempt, self.deadline
        await trio.lowlevel.checkpoint_if_cancelled()
        conn = self.conn = await self.slots.checkout(self.origin, deadline)
        attempt.reused = conn.requests > 0
        try:
            head, body = conn.request_bytes(
                self.method, self.target.path, self.target.host_header, self.headers, self.content
            )
            attempt.phase = Phase.SEND
            await conn.send(head, body, deadline, attempt)
            attempt.phase = Phase.AWAIT_HEADERS
            h = conn.h11
            first = True
            while True:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    try:
                        data = await conn.receive(self.deadline, self.read_timeout, attempt, first)
                    except PoolTimeout:
                        if self.extended():
                            continue
                        raise
                    first = False
                    attempt.response_bytes += len(data)
                    h.receive_data(data)
                elif type(event) is h11.Response:
                    attempt.phase = Phase.READ_BODY
                    response = self.response = StreamResponse(
                        event.status_code, header_list(event.headers), attempt.reused, self
                    )
                    return response
                elif type(event) is not h11.InformationalResponse:
                    raise attempt.closed()
        except BaseException as exc:
            self.abandon()
            if isinstance(exc, OSError | h11.ProtocolError):
                raise attempt.failure(exc) from exc
            if self.progress is not None:  # cancelled: as ConnectionPool.request
                self.progress.phase = attempt.phase
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        response = self.response
        self.close(exc_type is None and response is not None and response.complete)

    def close(self, complete: bool) -> None:
        """Park the connection if the body was read to its end (``complete``), else
        close it. Idempotent."""
        conn = self.conn
        if conn is None:
            return
        if complete:
            self.conn = None
            self.slots.checkin(self.origin, conn)
        else:
            # Body not read to the end (or an error): the bytes still in flight
            # make the connection unusable. Closing (not draining) also tells the
            # engine to abort the generation.
            self.abandon()
