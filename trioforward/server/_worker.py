"""Hypercorn's trio worker, driven by us: batched accepts and a cheaper keep-alive.

Hypercorn's ``hypercorn.trio.serve`` wraps each listening socket in a
``trio.SocketListener``, which accepts one connection per scheduler pass; under
a burst the kernel's accept queue overflows (see :mod:`trioforward._listener`).
:func:`worker_serve` drives Hypercorn's own building blocks — ``Lifespan``,
``WorkerContext`` and (through :class:`KeepAliveTCPServer`) ``TCPServer`` with
its HTTP/1.1 protocol — over plain TCP only (no TLS, no QUIC: the gateway serves
plain HTTP behind whatever terminates TLS), with that listener in front.
:class:`KeepAliveTCPServer` changes two things of ``TCPServer``: the keep-alive
timer and the response writes (together they cut the gateway's CPU per request
by ~25 % and its growth with concurrency). It relies on ``TCPServer``
internals, which is why pyproject.toml pins Hypercorn's minor version.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from functools import partial
from math import inf
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr

from trioforward._listener import BurstListener

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
        if self.config.read_timeout is None:
            self.idle_task = _IdleDeadline(self)  # type: ignore[assignment]

    async def protocol_send(self, event: Event) -> None:
        """Writes ``RawData`` straight to the socket when no other write is pending
        and the kernel takes it all (the usual case: a response head or a body of a
        few kB), without Hypercorn's lock, shielded scope and scheduler pass per
        write (a response is three writes). The rest of the data, and every write
        while another is pending, goes through Hypercorn's ``protocol_send``; a
        cancelled task raises ``Cancelled`` as there."""
        if type(event) is RawData and not self.send_lock.locked():
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
                # One scheduler pass, as Hypercorn's write has: it lets the connection's
                # reader feed the rest of the request to h11 before the response ends
                # (Hypercorn closes a connection whose request is unfinished then).
                await trio.lowlevel.cancel_shielded_checkpoint()
                return
            event = RawData(data[sent:])
        await super().protocol_send(event)

    def set_read_deadline(self, deadline: float) -> None:
        self._read_deadline = deadline
        if self._read_scope is not None:
            self._read_scope.deadline = deadline

    async def _read_data(self) -> None:
        if not isinstance(self.idle_task, _IdleDeadline):
            await super()._read_data()
            return
        try:
            while True:
                scope = self._read_scope = trio.CancelScope(deadline=self._read_deadline)
                try:
                    with scope:
                        data = await self.stream.receive_some(MAX_RECV)
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
