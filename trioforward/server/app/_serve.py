"""Running the app under Hypercorn's trio worker, programmatically (docs/server.md, "Starting it").

The worker loop is Hypercorn's, with a listener that accepts in batches
(``_worker.py``: why ``hypercorn.trio.serve`` itself overflows the accept queue
under bursts).

``hypercorn_config(settings)`` holds every Hypercorn choice the gateway makes for
bursts and long generations; :func:`serve` runs an app until SIGTERM/SIGINT (or a
given trigger) and then drains: the listening sockets close at once, idle
keep-alive connections are closed, in-flight requests get ``shutdown_grace``
seconds to finish, then every remaining connection is cancelled (its forward too,
so its engine aborts the work) and the app's shutdown closes the dispatch client.
A request still QUEUED when the grace is about to end (:func:`answer_margin`
before it), or waiting for an engine while none can serve it, is answered 503
``shutting_down`` with ``Retry-After`` (``Client.begin_drain``; docs/server.md,
"Shutdown").
"""

from __future__ import annotations

import gc
import logging
import resource
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.utils import wrap_app

from trioforward import Settings
from trioforward.server.base._state import STATE_KEY
from trioforward.server.front import _gc
from trioforward.server.front._worker import worker_serve

__all__ = [
    "hypercorn_config", "serve", "listen", "somaxconn", "raise_open_files_limit", "tune_gc",
    "answer_margin",
]

log = logging.getLogger("trioforward.server")


def somaxconn(default: int = 4096) -> int:
    """The kernel's cap on a listen backlog (``/proc/sys/net/core/somaxconn``)."""
    try:
        with open("/proc/sys/net/core/somaxconn") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return default


def raise_open_files_limit() -> int:
    """Raises the soft ``RLIMIT_NOFILE`` to the hard limit; returns the new soft limit.

    Each client connection and each upstream connection is a descriptor: a burst of
    8192 requests needs about 16 k, well above the usual soft limit of 1024.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


def tune_gc() -> None:
    """Process-wide garbage-collector settings for a gateway process (call once, after
    the app is built, from the process that owns the interpreter).

    Measured (bench/gateway_burst.py): with CPython's default thresholds (700, 10,
    10) the gateway's CPU per request *grew* with the burst size — 0.6 ms at 64
    concurrent requests, 1.9 ms at 8192 — and the growth was all collector time:
    a burst allocates the state of thousands of in-flight requests at once, which
    triggers collection after collection over a large live set; with the collector
    off the cost was flat. The request path itself leaves no cyclic garbage (the
    collector only has exceptions' tracebacks to reclaim), so: freeze everything
    alive at startup (imports, the app) out of the collector's sight, collect the
    young generation every 20 000 net allocations instead of 700, and the older
    generations rarely. And while a burst is in flight (512+ requests)
    automatic collection pauses altogether (``_gc.BurstGC``: at 8192 in flight the
    young collections still cost ~100 µs per request, scanning live request state).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 1_000, 100)
    _gc.install(_gc.BurstGC())


def hypercorn_config(settings: Settings, *, bind: str | None = None) -> Config:
    """Hypercorn settings of the gateway.

    - backlog ``settings.backlog`` (4096), capped by ``somaxconn`` (Linux silently
      truncates a larger value anyway; capping makes the effective value visible);
    - keep-alive ``settings.keep_alive`` (75 s, above the 60 s of common client idle
      timeouts, so the client closes first and never races a server close), and no
      cap on requests per keep-alive connection (Hypercorn's default closes after 1000);
    - ``graceful_timeout`` = ``shutdown_grace``; no read timeout (a trainer may hold
      a connection through a long generation);
    - Hypercorn's own access log off: the gateway writes one line per request itself.
    """
    config = Config()
    if bind is None:
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        bind = f"{host}:{settings.port}"
    config.bind = [bind]
    config.backlog = min(settings.backlog, somaxconn())
    config.keep_alive_timeout = settings.keep_alive
    config.keep_alive_max_requests = 2**62
    config.graceful_timeout = settings.shutdown_grace
    config.read_timeout = None
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.loglevel = settings.log_level.upper()
    config.include_server_header = False
    return config


def listen(settings: Settings) -> socket.socket:
    """A listening TCP socket on ``settings.host:port`` (IPv6 when the host has a
    ``:``), with :func:`hypercorn_config`'s backlog, inheritable by worker processes.
    Hypercorn serves it as ``bind=f"fd://{sock.detach()}"``. Raises ``OSError``
    (a taken port, an address not on this machine)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
        sock.listen(hypercorn_config(settings).backlog)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


async def _signalled() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("%s received: draining (grace period applies)", signal.Signals(signum).name)
            return


def answer_margin(grace: float) -> float:
    """Seconds before the end of ``shutdown_grace`` at which requests still QUEUED are
    answered 503 ``shutting_down``: a tenth of the grace, at most 1 s — time for the
    answers to be written before the remaining connections are cancelled."""
    return min(1.0, 0.1 * grace)


def _drain_queue(app: Any, grace: float) -> Callable[[float], None]:
    """``on_drain`` of :func:`worker_serve`: the app's dispatch client ends its queue
    :func:`answer_margin` before the connections are cancelled."""

    def begin(deadline: float) -> None:
        state = getattr(app, "extensions", {}).get(STATE_KEY)
        if state is not None:  # not started (or another app): nothing is queued
            cutoff = deadline - answer_margin(grace)
            state.client.begin_drain(cutoff)
            for hook in state.on_drain:
                hook(cutoff)

    return begin


async def serve(
    app: Any,
    settings: Settings,
    *,
    bind: str | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves ``app`` until ``shutdown_trigger()`` returns (default: SIGTERM or SIGINT),
    then drains as described above (a gateway app's queued requests answered 503
    ``shutting_down``) and returns normally.

    ``task_status.started()`` gets the bound URLs (``["http://127.0.0.1:8000"]``);
    ``bind="127.0.0.1:0"`` picks a free port.
    """
    config = hypercorn_config(settings, bind=bind)
    await worker_serve(
        wrap_app(app, config.wsgi_max_body_size, "asgi"),
        config,
        shutdown_trigger=shutdown_trigger or _signalled,
        on_drain=_drain_queue(app, config.graceful_timeout),
        task_status=task_status,
    )
