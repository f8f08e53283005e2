"""Test harness: the gateway served by Hypercorn on 127.0.0.1:0 in process, simulated engines."""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
import trio.testing

from trioforward._settings import Settings
from trioforward.server import GatewayState, create_app, serve
from trioforward.server.app._serve import hypercorn_config


@dataclass
class Gateway:
    url: str
    app: Any
    stop: trio.Event  # set: the shutdown trigger (SIGTERM's part), the drain begins

    @property
    def state(self) -> GatewayState:
        state: GatewayState = self.app.extensions["trioforward"]
        return state

    async def pool_active(self) -> int:
        """Active upstream connections once every task has settled (a response is
        complete for the client a moment before its handler leaves the stream block)."""
        await trio.testing.wait_all_tasks_blocked()
        return int(self.state.client.statistics().pool.active)


@asynccontextmanager
async def open_gateway(
    *engine_urls: str, stock_hypercorn: bool = False, **knobs: Any
) -> AsyncIterator[Gateway]:
    """The gateway app under our Hypercorn trio worker (``trioforward serve``'s) on a
    free loopback port; ``stock_hypercorn=True``: under ``hypercorn.trio.serve``
    itself, as ``hypercorn -k trio "trioforward.server:create_app()"`` runs it."""
    settings = Settings(engines=tuple(engine_urls)).replace(**knobs)
    app = create_app(settings)
    stop = trio.Event()
    if stock_hypercorn:
        from hypercorn.trio import serve as hypercorn_serve

        config = hypercorn_config(settings, bind="127.0.0.1:0")
        start: Any = functools.partial(hypercorn_serve, app, config, shutdown_trigger=stop.wait)
    else:
        start = functools.partial(serve, app, settings, bind="127.0.0.1:0", shutdown_trigger=stop.wait)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(start)
        try:
            yield Gateway(binds[0], app, stop)
        finally:
            stop.set()


@asynccontextmanager
async def open_sim(**kwargs: Any) -> AsyncIterator[Any]:
    from trioforward.sim import open_engine

    async with open_engine(port=0, **kwargs) as engine:
        yield engine


def generation_requests(engine: Any) -> int:
    """Generation requests the engine received (health probes excluded)."""
    by_path = engine.stats.by_path
    return int(by_path["/v1/completions"] + by_path["/v1/chat/completions"])


def free_port() -> int:
    """A loopback TCP port free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start_serve(engine_url: str, *flags: str) -> tuple[trio.Process, str, bytearray]:
    """A ``trioforward serve`` process on a free port, once it listens: ``(process,
    base URL, its stderr so far)``; :func:`reap` it."""
    port = free_port()
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", "from trioforward.cli import main; main()", "serve",
         "--engine", engine_url, "--port", str(port), *flags],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    log = bytearray()
    assert proc.stderr is not None
    try:
        with trio.fail_after(60):
            while b"listening on" not in log:
                chunk = await proc.stderr.receive_some()
                if not chunk:
                    raise AssertionError(f"gateway exited: {log.decode()}")
                log += chunk
    except BaseException:
        await reap(proc)
        raise
    return proc, f"http://127.0.0.1:{port}", log


async def reap(proc: trio.Process) -> None:
    """Kill ``proc`` if it runs, wait for it, close its stderr (shielded)."""
    if proc.returncode is None:
        proc.kill()
    with trio.CancelScope(shield=True):
        await proc.wait()
        if proc.stderr is not None:
            await proc.stderr.aclose()
