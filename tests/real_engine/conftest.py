"""Live vLLM servers and a gateway in front of them (run by `nox -s real_engine`).

Two vLLM 0.32 CPU servers on 127.0.0.1, started once per session from a tiny
model made on the spot (tiny_model.py), each tracked by its PID and stopped at
the end (SIGTERM to its process group, SIGKILL after 30 s):

- ``vllm_base``: no LoRA; ``VLLM_SERVER_DEV_MODE=1`` (its weight-update endpoints);
- ``vllm_lora``: ``--enable-lora --max-loras 2``, runtime LoRA updating and the
  filesystem resolver.

Their logs are in the session's temporary directory and their tails are printed
under any failing test. docs/compatibility.md says how to run this suite.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim"))  # vllm_probes

STARTUP_TIMEOUT = 300.0  # seconds; 21-38 s on an idle 2-core machine
MAX_LORAS = 2
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """One started process: its PID, URL and log file."""

    name: str
    url: str
    log: Path
    process: subprocess.Popen[bytes]
    extra: dict[str, str] = field(default_factory=dict)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def count(self, needle: str) -> int:
        """How many log lines contain ``needle``."""
        return sum(needle in line for line in self.log_text().splitlines())

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # the group this process leads
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


SERVERS: list[Server] = []


def start(name: str, argv: list[str], log: Path, env: dict[str, str]) -> Server:
    """Start ``argv`` in its own process group, output to ``log``."""
    port = free_port()
    argv = [a.replace("{port}", str(port)) for a in argv]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
    server = Server(name, f"http://127.0.0.1:{port}", log, process)
    SERVERS.append(server)
    return server


def wait_healthy(server: Server, path: str = "/health", timeout: float = STARTUP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with {server.process.returncode}:\n{server.log_text()[-4000:]}"
            )
        try:
            if httpx.get(server.url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{server.name} not healthy after {timeout} s:\n{server.log_text()[-4000:]}")


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and its adapters (tiny_model.py)."""
    from tiny_model import build

    root = tmp_path_factory.mktemp("real_engine")
    build(root)
    return root


def _vllm(root: Path, name: str, lora: bool) -> Server:
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(root / "tiny"), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", "{port}",
        "--max-model-len", "256", "--dtype", "float32", "--enforce-eager",
    ]  # fmt: skip
    env = dict(ENV)
    if not lora:
        # vLLM's RL endpoints (/pause, /resume, /is_paused, /update_weight_version):
        # the weight-update test (test_real_weight_update.py) pauses this engine.
        env["VLLM_SERVER_DEV_MODE"] = "1"
        # vLLM's token route (/inference/v1/generate, /inference/v1/abort_requests):
        # test_real_token_route.py (docs/server.md, "Token routes").
        argv += ["--enable-scale-out"]
    if lora:
        argv += ["--enable-lora", "--max-lora-rank", "8", "--max-loras", str(MAX_LORAS)]
        argv += ["--enable-log-requests"]  # logs "Aborted request(s) ID" (the disconnect test)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env["VLLM_LORA_RESOLVER_CACHE_DIR"] = str(root / "resolver")
    return start(name, argv, root / f"{name}.log", env)


@pytest.fixture(scope="session")
def engines(workdir: Path) -> Iterator[dict[str, Server]]:
    """Both vLLM servers, started side by side, healthy; stopped after the session."""
    started = {"base": _vllm(workdir, "vllm_base", False), "lora": _vllm(workdir, "vllm_lora", True)}
    try:
        t0 = time.monotonic()
        for server in started.values():
            wait_healthy(server)
        print(f"\nvLLM servers healthy after {time.monotonic() - t0:.1f} s; logs in {workdir}")
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="session")
def vllm_base(engines: dict[str, Server]) -> Server:
    return engines["base"]


@pytest.fixture(scope="session")
def vllm_lora(engines: dict[str, Server]) -> Server:
    return engines["lora"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if report.failed:  # type: ignore[attr-defined]
        for server in SERVERS:
            tail = "\n".join(server.log_text().splitlines()[-60:])
            report.sections.append((f"{server.name} log tail ({server.log})", tail))  # type: ignore[attr-defined]
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    for server in SERVERS:
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def recorded(engines: dict[str, Server], workdir: Path) -> Path:
    """The probes' answers from the fresh servers, before any other test touches them.

    With TRIOFORWARD_RECORD_FIXTURES=1 they replace tests/sim/vllm_0_32_fixtures/.
    """
    from record_vllm import record
    from vllm_probes import FIXTURES

    out = FIXTURES if os.environ.get("TRIOFORWARD_RECORD_FIXTURES") else workdir / "recorded"
    record({name: server.url for name, server in engines.items()}, workdir, out)
    return out


def _gateway(name: str, engine: Server, workdir: Path) -> Iterator[Server]:
    argv = [
        sys.executable, "-m", "trioforward", "serve",
        "--engine", engine.url, "--host", "127.0.0.1", "--port", "{port}",
        "--adapter-root", str(workdir / "tinker"), "--engine-capacity", "16",
    ]  # fmt: skip
    server = start(name, argv, workdir / f"{name}.log", {})
    try:
        wait_healthy(server, timeout=60)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gateway_base(vllm_base: Server, workdir: Path) -> Iterator[Server]:
    """``trioforward serve`` in front of the engine without LoRA.

    (vLLM 0.32 CPU's engine crashes on ``prompt_logprobs`` when LoRA is enabled:
    docs/compatibility.md, so the OpenAI tests use this one.)
    """
    yield from _gateway("gateway_base", vllm_base, workdir)


@pytest.fixture(scope="session")
def gateway_lora(vllm_lora: Server, workdir: Path) -> Iterator[Server]:
    """``trioforward serve`` in front of the LoRA engine (tinker:// adapters under workdir/tinker)."""
    yield from _gateway("gateway_lora", vllm_lora, workdir)
