"""The RL stacks' own clients against ``trioforward serve`` over simulated engines
(docs/compatibility.md, "The RL stacks' own clients"; ``nox -s clients``).

These tests run in the clients' own virtualenv (AReaL, verifiers,
tinker-cookbook and what they import: never the gateway's), so the gateway
and the sims run as processes of the gateway's Python, named by
``TRIOFORWARD_GATEWAY_PYTHON`` (``nox -s clients`` sets it to its own).
Everything listens on 127.0.0.1 only; each process is stopped at the end of
its test. What the tests assert is read off the sims' own counters
(``GET /sim/stats``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

GATEWAY_PYTHON = os.environ.get("TRIOFORWARD_GATEWAY_PYTHON", sys.executable)
CLI = "from trioforward.cli import main; main()"
STARTUP_SECONDS = 60.0


@dataclass
class Process:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/sim/stats", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(proc: Process, path: str) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:  # bounded: a process that never answers fails the test
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited: {proc.log.read_text()[-3000:]}")
        try:
            if httpx.get(proc.url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name} did not answer {path} in {STARTUP_SECONDS} s")


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    """``launch("sim-engine", "--kind", "sglang")`` / ``launch("serve", "--engine", url)``:
    a process of the gateway's Python on a free loopback port, answering."""
    started: list[Process] = []

    def start(command: str, *args: str) -> Process:
        port = _free_port()
        log = tmp_path / f"{command}-{port}.log"
        argv = [GATEWAY_PYTHON, "-c", CLI, command, "--host", "127.0.0.1", "--port", str(port), *args]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        p = Process(command, f"http://127.0.0.1:{port}", proc, log)
        started.append(p)
        _wait(p, "/health" if command == "serve" else "/sim/stats")
        return p

    yield start
    for p in reversed(started):
        p.stop()


def access_statuses(gateway: Process, at_least: int = 0) -> list[int]:
    """The statuses of the gateway's access-log lines so far; with ``at_least``, once
    that many are written (the line of an answer is logged after it was sent)."""
    deadline = time.monotonic() + 10
    while True:  # bounded: another process's log file
        text = gateway.log.read_text()
        statuses = [int(m) for m in re.findall(r"trioforward.access: \S+ \S+ (\d{3})", text)]
        if len(statuses) >= at_least or time.monotonic() > deadline:
            return statuses
        time.sleep(0.05)


def wait_stats(sim: Process, ok: Callable[[dict[str, Any]], bool], seconds: float = 30.0) -> dict[str, Any]:
    """Poll the sim's counters (another process's) until ``ok`` holds; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded: another process's counters
        stats = sim.stats()
        if ok(stats):
            return stats
        time.sleep(0.05)
    raise AssertionError(f"sim counters never matched: {sim.stats()}")


class SimTokenizer:
    """A tokenizer matched to the sims' vocabulary, built here (no hub downloads):
    text encodes to its UTF-8 bytes (ids 0..255, all in the sims' vocabulary); an
    id decodes to ``" t<id>"``, the sims' own rendering (docs/sim.md). What the
    clients' renderers call of a Hugging Face tokenizer: ``encode``, ``decode``,
    ``eos_token_id``, ``bos_token``, ``name_or_path``."""

    eos_token_id = None
    bos_token = None
    name_or_path = "sim-base"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Any, skip_special_tokens: bool = False, **_: Any) -> str:
        ids = [ids] if isinstance(ids, int) else ids
        return "".join(f" t{i}" for i in ids)
