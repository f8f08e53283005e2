"""Hypercorn's trio worker loop with a listener that drains the accept queue in batches.

Why not ``hypercorn.trio.serve`` as is: it wraps each listening socket in a
``trio.SocketListener``, whose ``accept()`` takes one connection and then yields
to the scheduler. Under a burst the accept task therefore gets one connection per
scheduler pass while thousands of accepted connections are busy; the kernel's
accept queue (``somaxconn``) overflows and the kernel drops further SYNs, which
clients retry after 1 s, 3 s, 7 s... — a burst of 8192 took seconds longer and
``ListenOverflows`` grew. :class:`BurstListener` instead accepts up to
``batch`` ready connections per wake-up (as asyncio's accept loop does) and hands
them to ``trio.serve_listeners`` without further syscalls or scheduler passes.

:func:`worker_serve` is ``hypercorn.trio.run.worker_serve`` (Hypercorn 0.18, MIT
licence) reduced to plain TCP (no TLS, no QUIC — the gateway serves plain HTTP
behind whatever terminates TLS) with that listener swapped in; the protocol
handling (``TCPServer``), lifespan and graceful shutdown are Hypercorn's own.
"""

from __future__ import annotations

import errno
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, LifespanState
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr

__all__ = ["BurstListener", "worker_serve"]

# Errors that mean "out of descriptors/memory right now": trio.serve_listeners logs
# them and retries after 100 ms; anything else ends the server.
_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


class BurstListener(trio.abc.Listener[trio.SocketStream]):
    """A listener over a bound, listening stdlib socket that accepts in batches.

    ``accept()`` returns a connection accepted earlier in the current batch at
    once (no syscall, no scheduler pass); when none is left it waits until the
    socket is readable and accepts up to ``batch`` connections in one go.
    Cancellation: only while waiting for readability; connections already
    accepted stay queued for the next call and are closed by :meth:`aclose`.
    """

    def __init__(self, sock: socket.socket, batch: int = 512) -> None:
        sock.setblocking(False)
        self.socket = sock
        self._batch = batch
        self._ready: deque[trio.SocketStream] = deque()

    async def accept(self) -> trio.SocketStream:
        if self._ready:
            return self._ready.popleft()
        while True:
            await trio.lowlevel.wait_readable(self.socket)
            for _ in range(self._batch):
                try:
                    conn, _ = self.socket.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    # A connection reset while still queued is not our problem.
                    if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                        continue
                    if self._ready and exc.errno in _CAPACITY_ERRNOS:
                        break  # serve what we have; the next call reports it
                    raise
                self._ready.append(trio.SocketStream(trio.socket.from_stdlib_socket(conn)))
            if self._ready:
                return self._ready.popleft()

    async def aclose(self) -> None:
        self.socket.close()
        while self._ready:
            stream = self._ready.popleft()
            trio.socket.SocketType.close(stream.socket)
        await trio.lowlevel.checkpoint()


async def worker_serve(
    app: AppWrapper,
    config: Config,
    *,
    shutdown_trigger: Callable[..., Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves until ``shutdown_trigger()`` returns, then: listeners closed, idle
    connections closed, in-flight requests get ``config.graceful_timeout`` seconds,
    then the app's lifespan shutdown runs. Hypercorn's own sequence."""
    config.set_statsd_logger_class(StatsdLogger)
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(app, config, lifespan_state)
    context = WorkerContext(None)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()

        async with trio.open_nursery() as server_nursery:
            sockets = config.create_sockets()
            listeners = []
            binds = []
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(BurstListener(sock))
                bind = repr_socket_addr(sock.family, sock.getsockname())
                binds.append(f"http://{bind}")
                await config.log.info(f"Running on http://{bind} (CTRL + C to quit)")

            task_status.started(binds)
            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    nursery.start_soon(
                        partial(
                            trio.serve_listeners,
                            partial(TCPServer, app, config, context, ConnectionState(lifespan_state.copy())),
                            listeners,
                            handler_nursery=server_nursery,
                        ),
                    )
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, other_errors = error.split((ShutdownError, KeyboardInterrupt))
                if other_errors is not None:
                    raise other_errors from None
            finally:
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout

        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
