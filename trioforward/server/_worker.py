"""Hypercorn's trio worker, driven by us: batched accepts, cheaper connections.

Hypercorn's ``hypercorn.trio.serve`` wraps each listening socket in a
``trio.SocketListener``, which accepts one connection per scheduler pass; under
a burst the kernel's accept queue overflows (see :mod:`trioforward._listener`).
:func:`worker_serve` drives Hypercorn's own building blocks — ``Lifespan``,
``WorkerContext`` and (through :class:`KeepAliveTCPServer`) ``TCPServer`` with
its HTTP/1.1 protocol — over plain TCP only (no TLS, no QUIC: the gateway serves
plain HTTP behind whatever terminates TLS), with that listener in front.
:class:`KeepAliveTCPServer` changes four things of ``TCPServer``, all about
scheduler passes and system calls per request, which is what grows in cost when
thousands of requests are in flight (each pass touches a task whose state is no
longer in the CPU caches): the keep-alive timer (a read deadline, no task), the
reads (wait for readability first), the response writes (one write per
fixed-length response, no pass once the request was read), and the app's
message channel (:mod:`._appchannel`: no pass per message, and a disconnect hook
instead of a watcher task). Measured with ``bench/gateway_burst.py``: 9 scheduler
passes per proxied request before the last three changes, 3 after. It relies on
``TCPServer`` internals, which is why pyproject.toml pins Hypercorn's minor
version.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from functools import partial
from math import inf
from typing import Any

import h11
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol import ProtocolWrapper
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, LifespanState
from hypercorn.utils import parse_socket_addr, repr_socket_addr

from trioforward._listener import BurstListener
from trioforward.server._appchannel import AppTaskGroup

__all__ = ["KeepAliveTCPServer", "worker_serve"]

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
        if self.config.read_timeout is None:
            self.idle_task = _IdleDeadline(self)  # type: ignore[assignment]

    async def run(self) -> None:
        """``TCPServer.run`` for plain TCP (our worker serves no TLS), with
        :class:`AppTaskGroup` as the connection's task group: apps get the
        ``trioforward.disconnect`` extension (see :mod:`._appchannel`)."""
        try:
            socket = self.stream.socket
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())
            async with AppTaskGroup() as task_group:
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
                await self.protocol.initiate()
                await self.idle_task.restart(self._task_group, self._idle_timeout)
                await self._read_data()
        except OSError:
            pass
        finally:
            await self._close()

    async def protocol_send(self, event: Event) -> None:
        """Writes ``RawData`` straight to the socket when no other write is pending
        and the kernel takes it all (the usual case), without Hypercorn's lock,
        shielded scope and scheduler pass per write.

        The head of a fixed-length response (``content-length``) is held back
        with the first body chunk that follows it, and written with the next
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
            data = event.data
            if data[:9] == b"HTTP/1.1 " and data[9:10] != b"1" and b"\r\ncontent-length: " in data:
                await trio.lowlevel.checkpoint_if_cancelled()
                self._held_head = data
                return
            await self._write(event)
            return
        await super().protocol_send(event)

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
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return
            event = RawData(data[sent:])
        await super().protocol_send(event)

    def _request_read(self) -> bool:
        """Whether h11 has the whole current request (HTTP/1.1 only)."""
        connection = getattr(self.protocol.protocol, "connection", None)
        return getattr(connection, "their_state", None) is h11.DONE

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


async def worker_serve(
    app: AppWrapper,
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``config``'s plain-TCP binds until ``shutdown_trigger()`` returns.

    Order of events: the ASGI lifespan starts (the app opens its dispatch
    client); ``task_status.started(binds)`` reports the ``http://host:port``
    URLs; on the trigger (or Hypercorn's own terminate event) accepting stops,
    idle keep-alive connections close at once, in-flight requests get
    ``config.graceful_timeout`` seconds, and then the lifespan shuts down.
    """
    config.set_statsd_logger_class(StatsdLogger)
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(app, config, lifespan_state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        await _serve_connections(
            partial(KeepAliveTCPServer, app, config, context, ConnectionState(lifespan_state.copy())),
            config,
            context,
            shutdown_trigger,
            task_status,
        )
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def _serve_connections(
    make_server: Callable[..., KeepAliveTCPServer],
    config: Config,
    context: WorkerContext,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]],
) -> None:
    listeners: list[BurstListener] = []
    binds: list[str] = []
    for sock in config.create_sockets().insecure_sockets:
        sock.listen(config.backlog)
        listeners.append(BurstListener(sock))
        binds.append("http://" + repr_socket_addr(sock.family, sock.getsockname()))
        await config.log.info(f"Running on {binds[-1]} (CTRL + C to quit)")
    idle: set[KeepAliveTCPServer] = set()  # connections between two requests
    # Connections live in their own nursery so that they outlive the accept loop:
    # shutdown first stops accepting, then gives them the grace period.
    async with trio.open_nursery() as connections:
        try:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(
                    partial(
                        trio.serve_listeners,
                        partial(make_server, idle_set=idle),
                        listeners,
                        handler_nursery=connections,
                    )
                )
                task_status.started(binds)
                await _first_of(shutdown_trigger, context.terminate.wait)
                accepting.cancel_scope.cancel()
        finally:
            await context.terminated.set()  # new requests on open connections are refused
            for server in list(idle):
                server.set_read_deadline(-inf)  # idle keep-alive connections close now
            connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as any of ``waits`` returns; the others are cancelled."""
    async with trio.open_nursery() as nursery:

        async def run(wait: Callable[[], Awaitable[object]]) -> None:
            await wait()
            nursery.cancel_scope.cancel()

        for wait in waits:
            nursery.start_soon(run, wait)
