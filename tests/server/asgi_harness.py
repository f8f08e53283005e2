"""A bare ASGI app under the gateway's Hypercorn worker, for worker-level tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from trioforward._settings import Settings
from trioforward.server.app._serve import serve

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def answer_lifespan(receive: Receive, send: Send) -> None:
    """Complete every lifespan event until shutdown."""
    while True:
        message = await receive()
        kind = message["type"].rpartition(".")[2]
        await send({"type": f"lifespan.{kind}.complete"})
        if kind == "shutdown":
            return


@asynccontextmanager
async def serve_asgi(app: Any, settings: Settings) -> AsyncIterator[tuple[int, trio.Event]]:
    """Serve ``app`` on a free loopback port; yields ``(port, stop)``; stops on exit."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(
                app, settings, bind="127.0.0.1:0", shutdown_trigger=stop.wait, task_status=task_status
            )
        )
        try:
            yield int(binds[0].rpartition(":")[2]), stop
        finally:
            stop.set()
