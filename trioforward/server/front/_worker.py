"""Hypercorn's trio worker, driven by us: batched accepts, cheaper connections.

Hypercorn's ``hypercorn.trio.serve`` wraps each listening socket in a
``trio.SocketListener``, which accepts one connection per scheduler pass; under
a burst the kernel's accept queue overflows (see :mod:`trioforward._listener`).
:func:`worker_serve` drives Hypercorn's own building blocks — ``Lifespan``,
``WorkerContext`` and ``Config.create_sockets`` — over plain TCP only (no TLS,
no QUIC: the gateway serves plain HTTP behind whatever terminates TLS), with
that listener in front, and serves each connection with
:class:`~._tcpserver.KeepAliveTCPServer` (the private hooks, in their own
module).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from math import inf

import trio
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr

from trioforward._listener import BurstListener
from trioforward.server.front._tcpserver import KeepAliveTCPServer

__all__ = ["KeepAliveTCPServer", "worker_serve"]

async def worker_serve(
    app: AppWrapper,
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    on_drain: Callable[[float], None] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``config``'s plain-TCP binds until ``shutdown_trigger()`` returns.

    Order of events: the ASGI lifespan starts (the app opens its dispatch
    client); ``task_status.started(binds)`` reports the ``http://host:port``
    URLs; on the trigger (or Hypercorn's own terminate event) accepting stops,
    idle keep-alive connections close at once, ``on_drain(deadline)`` is called
    with the time (``trio.current_time()`` clock) at which the remaining
    connections will be cancelled, in-flight requests get
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
            on_drain,
            task_status,
        )
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def _serve_connections(
    make_server: Callable[..., KeepAliveTCPServer],
    config: Config,
    context: WorkerContext,
    shutdown_trigger: Callable[[], Awaitable[None]],
    on_drain: Callable[[float], None] | None,
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
            deadline = trio.current_time() + config.graceful_timeout
            if on_drain is not None:
                on_drain(deadline)  # the app answers what would not be served by then
            connections.cancel_scope.deadline = deadline


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as any of ``waits`` returns; the others are cancelled."""
    async with trio.open_nursery() as nursery:

        async def run(wait: Callable[[], Awaitable[object]]) -> None:
            await wait()
            nursery.cancel_scope.cancel()

        for wait in waits:
            nursery.start_soon(run, wait)
