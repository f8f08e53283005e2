"""One HTTP/1.1 client connection: an h11 state machine over a trio TCP socket.

Why raw ``os.read``/``os.write`` on the socket's descriptor instead of
``SocketStream.send_all``/``receive_some``: this is the per-request hot path the
pool is measured on (docs/performance.md). The stream methods add a conflict
detector, a memoryview send loop and two checkpoints per call; here a request
costs one ``write`` and, typically, one ``trio.lowlevel.wait_readable`` plus one
64 KiB ``read``. trio still owns the socket: it was opened by
``trio.open_tcp_stream`` and is closed through ``trio.socket`` (which notifies
trio's I/O manager), and only the task driving the connection touches it.
"""

from __future__ import annotations

import math
import os
import select
from collections.abc import Awaitable, Callable

import trio

from trioforward._h11 import h11
from trioforward.http._errors import Phase
from trioforward.http._phases import Attempt

__all__ = ["Connection", "RECEIVE_SIZE"]

RECEIVE_SIZE = 65536  # bytes per read: a whole small response, or a big stream in few syscalls
_ONE_WRITE = 65536  # headers and a body up to this size go out in one write
_POLLIN = select.POLLIN
_READ_BODY = Phase.READ_BODY
_inf = math.inf
_read = os.read
_write = os.write
_wait_readable = trio.lowlevel.wait_readable
_wait_writable = trio.lowlevel.wait_writable
_current_time = trio.current_time
_EOM = h11.EndOfMessage()
_NO_BODY_METHODS = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS", b"TRACE"})
_HOST = b"host"
_CONTENT_LENGTH = b"content-length"


class Connection:
    """A connected socket plus its h11 client state.

    Owned by exactly one task at a time (the one holding its pool slot) or
    parked in an idle deque. ``requests`` counts completed exchanges (``> 0``
    means the next one is on a *reused* connection); ``idle_since`` is the
    ``trio.current_time()`` at which it was parked.
    """

    __slots__ = ("socket", "fd", "h11", "requests", "idle_since")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.socket = stream.socket
        self.fd = self.socket.fileno()
        self.h11 = h11.Connection(h11.CLIENT)
        self.requests = 0
        self.idle_since = 0.0

    def close(self) -> None:
        """Close the socket now (synchronous: nothing to await, nothing to shield)."""
        self.socket.close()

    def is_readable(self) -> bool:
        """The readability probe done on checkout (docs/design.md, "The connection pool").

        An idle keep-alive connection has nothing to read; if it is readable the
        engine closed it (EOF), reset it, or sent bytes nobody asked for. One
        ``poll`` with a zero timeout, no byte consumed. ``poll`` rather than
        ``select`` because descriptors go past FD_SETSIZE (1024) at high fan-out.
        """
        probe = select.poll()
        probe.register(self.fd, _POLLIN)
        return bool(probe.poll(0))

    def request_bytes(
        self,
        method: bytes,
        path: bytes,
        host: bytes,
        headers: list[tuple[str | bytes, str | bytes]] | None,
        content: bytes,
    ) -> tuple[bytes, bytes]:
        """Run the request through h11; returns ``(head, body)`` ready to write.

        ``Host`` and ``Content-Length`` are added here. Raises ``ValueError``
        for headers h11 refuses (nothing has been sent then).
        """
        fields: list[tuple[str | bytes, str | bytes]] = [(_HOST, host)]
        if content or method not in _NO_BODY_METHODS:
            fields.append((_CONTENT_LENGTH, b"%d" % len(content)))
        if headers:
            fields.extend(headers)
        h = self.h11
        try:
            head = h.send(h11.Request(method=method, target=path, headers=fields))  # type: ignore[arg-type]
            if content:
                h.send_with_data_passthrough(h11.Data(data=content))
            h.send(_EOM)
        except h11.LocalProtocolError as exc:
            raise ValueError(f"invalid request: {exc}") from exc
        assert head is not None
        return head, content

    async def send(self, head: bytes, body: bytes, deadline: float, attempt: Attempt) -> None:
        """Write the request. The caller has set ``attempt.phase = SEND`` already.

        Raises ``OSError`` (reset, broken pipe) for the caller to classify, or
        the attempt's timeout error if ``deadline`` passes while the socket
        buffer is full.
        """
        if len(body) <= _ONE_WRITE:
            await self._write_all(head + body if body else head, deadline, attempt)
        else:
            await self._write_all(head, deadline, attempt)
            await self._write_all(body, deadline, attempt)

    async def _write_all(self, data: bytes, deadline: float, attempt: Attempt) -> None:
        try:
            sent = _write(self.fd, data)
        except BlockingIOError:
            sent = 0
        if sent != len(data):
            await self.send_rest(data, sent, deadline, attempt)

    async def send_rest(self, data: bytes, sent: int, deadline: float, attempt: Attempt) -> None:
        """The slow path of a write: the socket buffer is full (large body, slow reader)."""
        fd = self.fd
        view = memoryview(data)
        while sent < len(view):
            await _wait(_wait_writable, fd, deadline, attempt, "deadline")
            try:
                sent += _write(fd, view[sent:])
            except BlockingIOError:
                pass

    async def receive(
        self, deadline: float, read_timeout: float | None, attempt: Attempt, wait_first: bool
    ) -> bytes:
        """Up to :data:`RECEIVE_SIZE` bytes; ``b""`` at EOF.

        ``wait_first``: skip the doomed read when nothing can have arrived yet
        (right after sending). In READ_BODY, ``read_timeout`` bounds the silence
        before the next byte. Raises ``OSError`` for the caller to classify, or
        the attempt's timeout error.
        """
        fd = self.fd
        if not wait_first:
            try:
                return _read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                pass
        while True:
            await _wait_until(fd, deadline, read_timeout, attempt)
            try:
                return _read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                continue


async def _wait_until(
    fd: int, deadline: float, read_timeout: float | None, attempt: Attempt
) -> None:
    """Wait until ``fd`` is readable; past ``deadline`` (or, in READ_BODY, after
    ``read_timeout`` s of silence) raise the attempt's timeout error."""
    what = "deadline"
    if read_timeout is not None and attempt.phase is _READ_BODY:
        silence = _current_time() + read_timeout
        if silence < deadline:
            deadline, what = silence, "read_timeout"
    await _wait(_wait_readable, fd, deadline, attempt, what)


async def _wait(
    waiter: Callable[[int], Awaitable[None]], fd: int, deadline: float, attempt: Attempt, what: str
) -> None:
    """``await waiter(fd)``; past ``deadline`` raise the attempt's timeout error.

    A cancel scope is only built when there is a deadline: most waits have none
    and a scope per wait is measurable at thousands of requests per second.
    """
    if deadline == _inf:
        await waiter(fd)
        return
    with trio.CancelScope(deadline=deadline) as scope:
        await waiter(fd)
    if scope.cancelled_caught:
        raise attempt.timeout(what)
