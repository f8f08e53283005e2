"""Private hooks into Hypercorn 0.18's ``TCPServer``: one connection of the gateway's worker.

:class:`KeepAliveTCPServer` is Hypercorn's ``hypercorn.trio.tcp_server.TCPServer``
with four changes, all about scheduler passes and system calls per request, which
is what grows in cost when thousands of requests are in flight (each pass
touches a task whose state is no longer in the CPU caches). Gains measured with
``bench/gateway_burst.py`` (docs/performance.md, "Private hooks"):

- the keep-alive timer is the deadline of the connection's pending read, not a
  timer task per request (~50 µs per request saved at a burst of 64, ~95 at 8192);
- one write per fixed-length response, straight to the socket (system time per
  request at 8192: 38-45 → 26-27 µs);
- reads wait for readability first, and a write yields to the scheduler only
  while the request is unread (with the app channel: 9 → 3 passes per request).

Two more are about ending connections: its HTTP/1.1 protocol is
:class:`~._h11front.FrontH11Protocol` (ambiguous framings refused, JSON bodies on
the front's own refusals), and closing is shielded from cancellation with the
keep-alive deadline armed once the protocol ends the connection (a must-close
answer left the socket open: :meth:`KeepAliveTCPServer._close`).

What it relies on, checked by ``tests/server/test_private_hooks.py`` (which
fails when the pinned Hypercorn changes any of it; pyproject.toml pins the
minor version):

- ``TCPServer.__init__`` attributes ``app``, ``config``, ``context``,
  ``send_lock``, ``idle_task``, ``stream``, ``state``; ``run`` (re-implemented
  here for plain TCP, with :class:`~._appchannel.AppTaskGroup`) setting
  ``_task_group`` and ``protocol``; ``protocol_send`` (the fallback for writes
  and non-data events), ``_read_data`` (used when ``read_timeout`` is set),
  ``_close`` (overridden: shielded), ``_idle_timeout`` and ``_initiate_server_close``;
- the ``idle_task`` duck type ``restart(task_group, action)`` / ``stop()``
  (``TrioSingleTask``), replaced by :class:`_IdleDeadline`;
- ``ProtocolWrapper``'s constructor arguments and its ``protocol`` attribute, an
  ``H11Protocol`` (replaced by ours, built with the same arguments) whose
  ``connection`` is Hypercorn's ``h11.Connection``;
- Hypercorn writing a response head while the app's ``http.response.start``
  is being sent (``HTTPStream.app_send``), so :class:`_ResponseSend` can flag
  it.
"""

from __future__ import annotations

import logging
import os
from math import inf
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol import ProtocolWrapper
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.typing import ConnectionState
from hypercorn.utils import parse_socket_addr

from trioforward._h11 import front_h11
from trioforward.server.front._appchannel import AppTaskGroup, Send
from trioforward.server.front._leanstream import LeanH11Protocol

if TYPE_CHECKING:
    import h11
else:
    h11 = front_h11()  # the h11 Hypercorn's H11Protocol uses (trioforward._h11)

__all__ = ["KeepAliveTCPServer"]

log = logging.getLogger("trioforward.server")

_yield_to_reader = trio.lowlevel.cancel_shielded_checkpoint  # the pass a write may take


def _peer(stream: Any) -> str:
    """``host:port`` of a connection's client (``stream``: its ``trio.SocketStream``)."""
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "a closed socket"
    return f"{host}:{port}"


class _IdleDeadline:
    """Stands in for Hypercorn's ``TrioSingleTask`` idle timer of one connection:
    ``restart`` (connection idle) sets the deadline of the connection's read,
    ``stop`` (a request started) lifts it. No task, lock or scheduler pass."""

    __slots__ = ("server",)

    def __init__(self, server: KeepAliveTCPServer) -> None:
        self.server = server

    async def restart(self, task_group: Any, action: Any) -> None:
        server = self.server
        server.idle_since = trio.current_time()
        if server.reading:
            server.idle_set.add(server)
        if server.context.terminated.is_set():
            server.set_read_deadline(-inf)
        else:
            server.set_read_deadline(server.idle_since + server.config.keep_alive_timeout)

    async def stop(self) -> None:
        server = self.server
        server.idle_since = None
        server.idle_set.discard(server)
        server.set_read_deadline(inf)


class KeepAliveTCPServer(TCPServer):
    """Hypercorn's ``TCPServer`` with the keep-alive timeout as the deadline of the
    connection's pending read instead of a timer task.

    Hypercorn restarts a timer task per request (``TrioSingleTask.restart``: a
    lock, ``nursery.start`` of a new task, cancellation of the previous one, and a
    deadline in trio's timer heap), about a quarter of the scheduler steps of a
    request. Here the connection's read loop, which is always waiting on the
    socket anyway, carries the timeout: when the connection goes idle its read
    gets the deadline ``now + keep_alive_timeout``; a request lifts it. When it
    expires while idle the connection is closed as Hypercorn's timer would
    (``_initiate_server_close``, shielded). On graceful shutdown
    :func:`worker_serve` cancels the reads of every idle connection (Hypercorn's
    timer waits on ``context.terminated`` for that), and a connection going idle
    afterwards closes at once. With ``config.read_timeout`` set it behaves
    exactly like ``TCPServer``.
    """

    def __init__(self, *args: Any, idle_set: set[KeepAliveTCPServer]) -> None:
        super().__init__(*args)
        self.idle_set = idle_set
        self.idle_since: float | None = None
        self.reading = True  # False once the read loop has ended
        self._read_deadline = inf
        self._read_scope: trio.CancelScope | None = None
        self._held_head: bytes | None = None  # a response not written yet
        self._held_body = False  # ... which includes (the first chunk of) its body
        self._hold_next = False  # the next write is a fixed-length response's head
        if self.config.read_timeout is None:
            self.idle_task = _IdleDeadline(self)  # type: ignore[assignment]

    async def run(self) -> None:
        """``TCPServer.run`` for plain TCP (our worker serves no TLS), with
        :class:`AppTaskGroup` as the connection's task group: apps get the
        ``trioforward.disconnect`` extension (see :mod:`._appchannel`). An
        ``h11.LocalProtocolError`` escaping the connection's tasks closes this
        connection (logged on ``trioforward.server``) instead of ending the worker."""
        try:
            socket = self.stream.socket
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())
            async with AppTaskGroup(self.app_send) as task_group:
                self._task_group = task_group
                self.protocol = ProtocolWrapper(
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                    "http/1.1",
                )
                # The front's refusals of ambiguous framings (_h11front) and plain
                # requests through the lean stream (_leanstream).
                self.protocol.protocol = LeanH11Protocol(
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                )
                await self.protocol.initiate()
                await self.idle_task.restart(self._task_group, self._idle_timeout)
                await self._read_data()
        except* OSError:
            pass
        except* h11.LocalProtocolError as group:
            # h11 refused what was to be sent on this connection (its state is then
            # ERROR, and Hypercorn's 500 for the app that failed meanwhile is refused
            # too). Under stock Hypercorn the error ends ``serve`` and every
            # connection; here it ends this connection only.
            log.error(
                "connection from %s closed after an HTTP/1.1 protocol error in its response",
                _peer(self.stream),
                exc_info=group,
            )
        finally:
            await self._close()

    async def protocol_send(self, event: Event) -> None:
        """Writes ``RawData`` straight to the socket when no other write is pending
        and the kernel takes it all (the usual case), without Hypercorn's lock,
        shielded scope and scheduler pass per write.

        The head of a fixed-length response (the app's ``http.response.start``
        message had a ``content-length`` header: :class:`_ResponseSend`) is held
        back with the first body chunk that follows it, and written with the next
        write (the end of message, or a second chunk) or before any other event:
        a whole response is one write (one TCP segment) instead of two
        (Hypercorn writes the head at ``http.response.start`` and each body
        message as it comes). Streamed (chunked) responses are written as they
        come. The rest of a partial write, and every write while another is
        pending, goes through Hypercorn's ``protocol_send``; a cancelled task
        raises ``Cancelled`` as there (and writes nothing, held head included)."""
        held = self._held_head
        if held is not None:
            self._held_head = None
            if type(event) is RawData:
                data = event.data
                if data and not self._held_body:
                    # The body: kept until the end of message that follows it.
                    await trio.lowlevel.checkpoint_if_cancelled()
                    self._held_head, self._held_body = held + data, True
                    return
                self._held_body = False
                await self._write(RawData(held + data))
                return
            self._held_body = False
            await self._write(RawData(held))
        elif type(event) is RawData:
            if self._hold_next:
                # The head of a fixed-length response (see _ResponseSend).
                self._hold_next = False
                await trio.lowlevel.checkpoint_if_cancelled()
                self._held_head = event.data
                return
            await self._write(event)
            return
        if type(event) is Closed:
            # The protocol ends the connection (a must-close answer, a refusal):
            # from now on the keep-alive deadline applies, whatever the state.
            if self.idle_since is None:
                self.idle_since = trio.current_time()
                self.set_read_deadline(self.idle_since + self.config.keep_alive_timeout)
        await super().protocol_send(event)

    async def _close(self) -> None:
        """Hypercorn's ``_close`` (EOF, then the socket closed), shielded.

        The ``Closed`` that ends a must-close answer (HTTP/1.0, ``Connection:
        close``) is sent from the app's task, and Quart cancels that task's scope
        as its response ends: unshielded, ``send_eof``'s checkpoint raised
        ``Cancelled`` before ``aclose`` ran, so the client got no EOF and the
        socket stayed open until the client left (two descriptors per probe of a
        Quart route; the keep-alive deadline was not armed either). Same on the
        cancellation that ends the shutdown grace (pgjones/hypercorn#106)."""
        with trio.CancelScope(shield=True):
            await super()._close()

    def app_send(self, send: Send) -> Send:
        """The ``send`` a request's app gets (see :class:`_ResponseSend`)."""
        return _ResponseSend(send, self)

    async def _write(self, event: RawData) -> None:
        """Writes ``event`` with one ``os.write`` when possible; then yields to the
        scheduler only if the request is not read yet (see below)."""
        if not self.send_lock.locked():
            # Like Hypercorn's lock acquisition: a cancelled task writes nothing
            # (e.g. no 500 after the shutdown grace period: the connection drops).
            await trio.lowlevel.checkpoint_if_cancelled()
            sock = self.stream.socket
            fd = sock.fileno()
            if fd == -1 or sock.did_shutdown_SHUT_WR:
                await self.protocol.handle(Closed())  # Hypercorn: ClosedResourceError
                return
            data = event.data
            sent = 0
            if data:
                try:
                    sent = os.write(fd, data)
                except BlockingIOError:
                    pass
                except OSError:  # EPIPE, ECONNRESET...: Hypercorn's BrokenResourceError
                    await self.protocol.handle(Closed())
                    return
            if sent == len(data):
                if not self._request_read():
                    # One scheduler pass, as Hypercorn's write has: it lets the
                    # connection's reader feed the rest of the request to h11 before
                    # the response ends (Hypercorn closes a connection whose request
                    # is unfinished then). Not needed once the request was read.
                    await _yield_to_reader()
                return
            event = RawData(data[sent:])
        await super().protocol_send(event)

    def _request_read(self) -> bool:
        """Whether h11 has the whole current request. Reads Hypercorn's own h11
        connection (``H11Protocol.connection``, of our :class:`LeanH11Protocol`);
        ``False`` for any other protocol (a WebSocket upgrade), which keeps
        Hypercorn's scheduler pass."""
        protocol = self.protocol.protocol
        if type(protocol) is LeanH11Protocol:
            connection = protocol.connection
            if type(connection) is h11.Connection:
                return connection.their_state is h11.DONE
        return False

    def set_read_deadline(self, deadline: float) -> None:
        self._read_deadline = deadline
        if self._read_scope is not None:
            self._read_scope.deadline = deadline

    async def _receive(self) -> bytes:
        """The next bytes from the client (b"" at EOF). Waits for readability
        first: between two requests of a keep-alive connection nothing is there
        yet, and trying the read first (``SocketStream.receive_some``) costs a
        failed ``recv`` and an exception per request.

        Raises ``trio.ClosedResourceError`` (socket closed by another task) or
        ``trio.BrokenResourceError`` (connection reset)."""
        sock = self.stream.socket
        while True:
            fd = sock.fileno()
            if fd == -1:
                raise trio.ClosedResourceError
            await trio.lowlevel.wait_readable(sock)
            try:
                return os.read(fd, MAX_RECV)
            except BlockingIOError:
                continue  # a spurious wake-up
            except OSError as exc:  # ECONNRESET, EBADF after a close...
                raise trio.BrokenResourceError from exc

    async def _read_data(self) -> None:
        if not isinstance(self.idle_task, _IdleDeadline):
            await super()._read_data()
            return
        try:
            while True:
                scope = self._read_scope = trio.CancelScope(deadline=self._read_deadline)
                try:
                    with scope:
                        data = await self._receive()
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    break
                finally:
                    self._read_scope = None
                if scope.cancelled_caught:
                    if self.idle_since is None:
                        continue  # a request started just as the deadline passed
                    with trio.CancelScope(shield=True):
                        await self._initiate_server_close()
                    break
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    break
        finally:
            self.reading = False
            self.idle_set.discard(self)
        await self.protocol.handle(Closed())


class _ResponseSend:
    """One request's ASGI ``send``, in front of Hypercorn's.

    An ``http.response.start`` message with a ``content-length`` header starts
    a fixed-length response: while Hypercorn turns it into the response head,
    the connection is told to hold that head for the body (one write per
    response, see :meth:`KeepAliveTCPServer.protocol_send`). The decision is
    made on the app's message, never by reading the serialized bytes.
    """

    __slots__ = ("send", "server")

    def __init__(self, send: Send, server: KeepAliveTCPServer) -> None:
        self.send = send
        self.server = server

    async def __call__(self, message: Any) -> None:
        if message is not None and message["type"] == "http.response.start":
            for name, _ in message.get("headers", ()):
                if name.lower() == b"content-length":
                    self.server._hold_next = True
                    try:
                        await self.send(message)
                    finally:
                        self.server._hold_next = False
                    return
        await self.send(message)
