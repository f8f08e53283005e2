"""The gateway, served by Hypercorn's trio worker inside the demo's own trio run."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from trioforward._settings import Settings

__all__ = ["Gateway", "serve_gateway"]

STARTUP_TIMEOUT = 30.0


@dataclass(slots=True)
class Gateway:
    """A running gateway: its base URL (``http://127.0.0.1:PORT``) and its app."""

    url: str
    app: Any

    @property
    def client(self) -> Any:
        """The gateway's dispatch client (``trioforward.Client``), for its statistics."""
        return self.app.extensions["trioforward"].client


@asynccontextmanager
async def serve_gateway(settings: Settings, port: int = 0) -> AsyncIterator[Gateway]:
    """Serve ``create_app(settings)`` on ``settings.host:port`` until the block exits.

    Runs exactly what ``trioforward serve`` runs (the server's Hypercorn
    configuration and drain logic), with a shutdown trigger instead of signals.
    ``port`` 0 picks a free port (read back from Hypercorn's bind list). On exit
    the gateway drains: in-flight requests finish within ``shutdown_grace``.
    """
    from trioforward.server import create_app, serve

    app = create_app(settings)
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        # If the app's startup fails, Hypercorn logs it and keeps waiting for a
        # startup that never completes: give up with a message instead of hanging.
        with trio.move_on_after(STARTUP_TIMEOUT) as startup:
            binds = await nursery.start(
                partial(serve, app, settings, bind=f"{settings.host}:{port}", shutdown_trigger=shutdown.wait)
            )
        if startup.cancelled_caught:
            raise RuntimeError(f"the gateway did not start within {STARTUP_TIMEOUT:.0f} s (see the log above)")
        try:
            yield Gateway(url=binds[0], app=app)
        finally:
            shutdown.set()
