"""Request-to-app messages with a disconnect hook, and the private hooks into Hypercorn
0.18's trio ``TaskGroup`` that install it (used by our worker).

Hypercorn hands an ASGI app its request messages through a trio memory channel
per request (``TaskGroup.spawn_app``), and reports a client that hung up as an
``http.disconnect`` message on that channel. An app that must stop work the
moment the client leaves — the gateway cancels the forward so the engine aborts
the generation — then needs a task per request parked on ``receive()`` just to
see that message (~30 µs per request: a task, its nursery, and a ``Cancelled``
unwinding through it at the end; docs/performance.md, "Private hooks").

:class:`AppChannel` is that channel plus a hook: Hypercorn's side puts messages
through :meth:`AppChannel.put`, which calls ``on_disconnect`` (when the app set
one) as the ``http.disconnect`` message is put, in the connection's own task. The
app finds the channel in ``scope["extensions"][DISCONNECT_EXTENSION]``; under any
other server the key is absent and the app falls back to a watcher task.
Backpressure as with Hypercorn's channel: at most ``config.max_app_queue_size``
messages wait for the app.

What :class:`AppTaskGroup` relies on, checked by
``tests/server/test_private_hooks.py`` (fails when the pinned Hypercorn changes
it): ``hypercorn.trio.task_group.TaskGroup`` with its ``_nursery`` (set by
``__aenter__``) and ``spawn_app(app, config, scope, send)`` returning the
stream's ``put``; the module function ``_handle(app, config, scope, receive,
send, sync_spawn, call_soon)`` that runs an app and logs its errors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio.task_group import TaskGroup, _handle
from hypercorn.typing import AppWrapper

from trioforward.server.front import _gc

__all__ = ["DISCONNECT_EXTENSION", "AppChannel", "AppTaskGroup", "Send"]

DISCONNECT_EXTENSION = "trioforward.disconnect"

Message = MutableMapping[str, Any]
Send = Callable[[Any], Awaitable[None]]


class AppChannel:
    """One request's messages from the server to the app: a queue of at most
    ``size`` messages (``config.max_app_queue_size``; at least 1).

    ``receive`` is what the app awaits, :meth:`put` what the server awaits;
    ``on_disconnect``: a synchronous callable the app may set (and must clear),
    called once when ``http.disconnect`` is put; ``disconnected`` tells an app
    that sets the hook late whether it already happened.

    A deque and, only while one side waits, a ``trio.lowlevel.ParkingLot``:
    opening a trio memory channel per request cost ~10 µs, a deque well under 1
    (docs/performance.md, "Private hooks").
    """

    __slots__ = ("_queue", "_size", "_closed", "_receiving", "_putting", "on_disconnect", "disconnected")

    def __init__(self, size: int) -> None:
        self._queue: deque[Message] = deque()
        self._size = max(1, size)
        self._closed = False
        self._receiving: trio.lowlevel.ParkingLot | None = None  # the app, waiting for a message
        self._putting: trio.lowlevel.ParkingLot | None = None  # the server, waiting for room
        self.on_disconnect: Callable[[], None] | None = None
        self.disconnected = False

    async def put(self, message: Message) -> None:
        """Hypercorn's side. Returns without a scheduler pass when there is room
        (a request's body and end-of-body messages would each cost one); waits
        while the queue is full and the app still runs (backpressure on the
        connection's reads). Never waits for ``http.disconnect`` (Hypercorn may
        put it from the app's own task, which would wait for itself), and drops
        messages once the app has ended (:meth:`close`): nobody will read them,
        and a wait would hold the connection open for good."""
        queue = self._queue
        if message["type"] == "http.disconnect":
            self.disconnected = True
            hook, self.on_disconnect = self.on_disconnect, None
            if hook is not None:
                hook()
            if not self._closed and len(queue) < self._size:
                queue.append(message)  # else receive() reports it once the queue is read
            self._wake(self._receiving)
            return
        if self._closed:
            return
        if len(queue) >= self._size:
            if self._putting is None:
                self._putting = trio.lowlevel.ParkingLot()
            while len(queue) >= self._size:
                await self._putting.park()
                if self._closed:
                    return  # the app ended while we waited
        queue.append(message)
        self._wake(self._receiving)

    async def receive(self) -> Message:
        """The app's side: the next message, waiting for one only if none is
        queued (no scheduler pass when the request is already there);
        ``http.disconnect`` once the client is gone and nothing else is queued."""
        queue = self._queue
        if not queue:
            if self.disconnected:
                return {"type": "http.disconnect"}
            if self._receiving is None:
                self._receiving = trio.lowlevel.ParkingLot()
            while not queue:
                await self._receiving.park()
                if not queue and self.disconnected:
                    return {"type": "http.disconnect"}
        message = queue.popleft()
        self._wake(self._putting)
        return message

    def close(self) -> None:
        """The app has ended: later (and waiting) puts drop their message."""
        self._closed = True
        self._queue.clear()
        self._wake(self._putting)

    @staticmethod
    def _wake(lot: trio.lowlevel.ParkingLot | None) -> None:
        if lot is not None and lot:
            lot.unpark_all()


async def _run_app(
    channel: AppChannel,
    app: AppWrapper,
    config: Config,
    scope: Any,
    send: Any,
    guard: _gc.BurstGC | None,
) -> None:
    """One request's app task; closes ``channel`` when the app has ended, and
    tells ``guard`` (which counted the request in when it was spawned)."""
    try:
        handle: Any = _handle  # Hypercorn's wrapper: logs the app's errors, then ends the stream
        await handle(
            app, config, scope, channel.receive, send, trio.to_thread.run_sync, trio.from_thread.run
        )
    finally:
        channel.close()
        if guard is not None:
            guard.exit()


class AppTaskGroup(TaskGroup):
    """Hypercorn's trio ``TaskGroup`` whose apps receive through an :class:`AppChannel`
    and send through ``app_send(send)`` (the connection's wrapper of Hypercorn's send)."""

    def __init__(self, app_send: Callable[[Send], Send]) -> None:
        super().__init__()
        self.app_send = app_send

    async def spawn_app(
        self,
        app: AppWrapper,
        config: Config,
        scope: Any,
        send: Send,
    ) -> Callable[[Any], Awaitable[None]]:
        return await self.spawn_app_direct(app, config, scope, self.app_send(send))

    async def spawn_app_direct(
        self,
        app: AppWrapper,
        config: Config,
        scope: Any,
        send: Send,
    ) -> Callable[[Any], Awaitable[None]]:
        """``spawn_app`` with ``send`` given to the app as it is (the lean stream's,
        which writes each fixed-length answer once by itself: ``_leanstream``)."""
        channel = AppChannel(config.max_app_queue_size)
        scope["extensions"][DISCONNECT_EXTENSION] = channel
        assert self._nursery is not None
        # The request counts as in flight for the collector's burst pause from
        # here: a burst's requests are read and their tasks spawned in one
        # scheduler batch, before any of them runs.
        guard = _gc.active
        if guard is not None:
            guard.enter()
        try:
            self._nursery.start_soon(_run_app, channel, app, config, scope, send, guard)
        except BaseException:
            if guard is not None:
                guard.exit()
            raise
        return channel.put
