"""The gateways ``bench/gateway_burst.py`` compares, started the same way.

Each target is a subprocess on its own loopback address (so the TCP 4-tuples of
two targets never compete for ephemeral ports) in front of the same simulated
engines (``trioforward sim-engine``, instant):

- ``trioforward``: ``trioforward serve``, default knobs;
- ``reference``: ``bench/reference_forwarder.py`` (uvicorn + FastAPI + aiohttp);
- ``smg``: Shepherd Model Gateway (PyPI ``smg``, Rust), ``python -m smg launch``;
- ``sglang-router``: SGLang's router (PyPI ``sglang-router``, Rust),
  ``python -m sglang_router launch``;
- ``direct``: straight to the engines (the floor: no gateway at all).

Both Rust gateways run with ``--policy round_robin`` (trioforward and the
reference rotate too) and their other defaults (retries, circuit breaker,
health checks) — what a user gets. smg also gets ``--queue-size 16384``: its
admission queue (default 100) must hold an 8192 burst. Each registers the
simulated engine as it is (it answers their probes: ``/health``,
``/server_info`` → 404 → ``/get_server_info``, ``/model_info`` → 404 →
``/get_model_info``, and a gRPC probe that the engine answers as a bad HTTP/1.1
request); a target counts as ready once each engine has answered a completion
through it. The two wheels both install a ``smg`` console script, so both are
started by module, never by script name.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI = "from trioforward.cli import main; main()"
NAMES = ("trioforward", "reference", "smg", "sglang-router", "direct")
# Loopback address per target (127.0.0.1 is the engines').
HOSTS = {"trioforward": "127.0.0.2", "reference": "127.0.0.3", "smg": "127.0.0.4", "sglang-router": "127.0.0.5"}
PACKAGES = {"trioforward": "trioforward", "smg": "smg", "sglang-router": "sglang-router",
            "reference": "uvicorn"}
READY_BODY = {"model": "sim-base", "prompt": "ready?", "max_tokens": 1}


@dataclass
class Target:
    """A started target: ``urls`` the load generator sends to; ``pid`` whose CPU is
    measured (None for direct); ``keep_alive`` the server's idle timeout in s (the
    load generator closes idle connections 1 s before it); ``argv`` how it was
    started (recorded in the JSON)."""

    name: str
    urls: list[str]
    pid: int | None
    keep_alive: float
    argv: list[str] = field(default_factory=list)
    version: str | None = None

    def plan(self) -> dict[str, Any]:
        return asdict(self)


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``args`` in a session of its own; ``env``: variables added to this process's."""
    return subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True,
        env=None if env is None else {**os.environ, **env},
    )


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()


def post_json(url: str, body: Any, timeout: float = 30.0) -> tuple[int | None, bytes]:
    """``(status, body)`` of a JSON POST; status None when the connection failed."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError as err:
        return None, type(err).__name__.encode()


def engine_stats(engine: str) -> dict[str, Any]:
    """The engine's ``GET /sim/stats``."""
    return json.loads(_get(engine + "/sim/stats")[1])


def wait_health(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if _get(url + "/health", timeout=1)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout} s")


def _completions(engine: str) -> int:
    return int(engine_stats(engine)["by_path"].get("/v1/completions", 0))


def wait_serving(url: str, engines: list[str], proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Returns once every engine has answered a completion sent through ``url``
    (the Rust gateways answer ``/health`` before their engines are registered)."""
    wait_health(url, proc, timeout)
    before = {e: _completions(e) for e in engines}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        post_json(url + "/v1/completions", READY_BODY, timeout=5)
        if all(_completions(e) > before[e] for e in engines):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not reach every engine within {timeout} s")


def start_engines(
    n: int, procs: list[subprocess.Popen[bytes]], argv: Callable[[int], list[str]] | None = None
) -> list[str]:
    """``n`` simulated engines on 127.0.0.1, started by ``argv(port)`` (default: an
    instant sim), each healthy before it returns; returns their URLs."""
    urls = []
    for _ in range(n):
        port = free_port("127.0.0.1")
        command = argv(port) if argv is not None else [sys.executable, "-c", CLI, "sim-engine", "--port", str(port)]
        proc = spawn(command)
        procs.append(proc)
        urls.append(f"http://127.0.0.1:{port}")
    for url, proc in zip(urls, procs[-n:], strict=True):
        wait_health(url, proc)
    return urls


def _argv(name: str, host: str, port: int, engines: list[str]) -> tuple[list[str], float]:
    """The command line of target ``name`` and its keep-alive timeout (s)."""
    py = sys.executable
    if name == "trioforward":
        args = [py, "-c", CLI, "serve", "--host", host, "--port", str(port),
                "--no-access-log", "--log-level", "warning"]
        for url in engines:
            args += ["--engine", url]
        return args, 75.0
    if name == "reference":
        args = [py, str(ROOT / "bench" / "reference_forwarder.py"), "--host", host, "--port", str(port)]
        for url in engines:
            args += ["--engine", url]
        return args, 5.0
    module = {"smg": "smg", "sglang-router": "sglang_router"}[name]
    args = [py, "-m", module, "launch", "--host", host, "--port", str(port),
            "--worker-urls", *engines, "--policy", "round_robin",
            "--prometheus-host", host, "--prometheus-port", str(free_port(host)),
            "--log-level", "warn"]
    if name == "smg":
        args += ["--queue-size", "16384"]
    # hyper's server keeps idle connections open; the client closes them.
    return args, 60.0


def start(name: str, engines: list[str], procs: list[subprocess.Popen[bytes]]) -> Target:
    """Starts target ``name`` (one of :data:`NAMES`) and waits until it serves."""
    if name == "direct":
        return Target("direct", list(engines), None, 5.0)
    host = HOSTS[name]
    port = free_port(host)
    args, keep_alive = _argv(name, host, port, engines)
    proc = spawn(args)
    procs.append(proc)
    url = f"http://{host}:{port}"
    wait_serving(url, engines, proc)
    try:
        version: str | None = metadata.version(PACKAGES[name])
    except metadata.PackageNotFoundError:
        version = None
    shown = ["python" if a == sys.executable else a.replace(f"{ROOT}/", "") for a in args]
    return Target(name, [url], proc.pid, keep_alive, shown, version)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
