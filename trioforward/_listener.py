"""A trio listener that drains the kernel's accept queue in batches.

``trio.SocketListener.accept()`` takes one connection and then yields to the
scheduler, so under a burst the accept task gets one connection per scheduler
pass while thousands of accepted connections keep the scheduler busy; the
kernel's accept queue (``somaxconn``) overflows and further SYNs are dropped
(clients retry after 1 s, 3 s, 7 s...). :class:`BurstListener` accepts every
ready connection (up to ``batch``) per wake-up, as asyncio's accept loop does.
Used by the gateway server and by the simulated engine.
"""

from __future__ import annotations

import errno
import socket
from collections import deque

import trio

__all__ = ["BurstListener"]

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
