"""The app under the plain ``hypercorn`` command behaves as under ``trioforward serve``
(docs/server.md, "Under the hypercorn command"): it logs (access lines, engine
ejections) and answers before startup as the hot routes do."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import trio
from gateway_harness import open_sim

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_logs_under_the_hypercorn_command(fd_baseline: int) -> None:
    async with open_sim() as engine, open_sim() as dead:
        await dead.stop_listening()
        port = _free_port()
        env = {
            **os.environ,
            "TRIOFORWARD_ENGINES": f"{engine.url},{dead.url}",
            "TRIOFORWARD_HEALTH_INTERVAL": "0",
            "TRIOFORWARD_HEALTH_FAILURES": "1",
            "TRIOFORWARD_ROUTING": "round-robin",
        }
        command = [
            sys.executable, "-m", "hypercorn", "-k", "trio", "--bind", f"127.0.0.1:{port}",
            "--graceful-timeout", "1", "trioforward.server:create_app()",
        ]
        process = await trio.lowlevel.open_process(command, env=env, stderr=subprocess.PIPE)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                with trio.fail_after(30):
                    while True:  # until the process listens and the app has started
                        try:
                            if (await client.get("/v1/models")).status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        await trio.sleep(0.05)
                    statuses = sorted(
                        [(await client.post("/v1/completions", json=BODY)).status_code
                         for _ in range(3)]
                    )
            assert statuses[0] == 200  # the live engine; the dead one is ejected on the way
        finally:
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                await process.wait()
        assert process.stderr is not None
        err = b""
        while chunk := await process.stderr.receive_some():
            err += chunk
        await process.stderr.aclose()
    text = err.decode()
    assert "trioforward.server: gateway serving 2 engine(s)" in text, text
    assert "trioforward.access: POST /v1/completions 200 engine=" in text, text
    assert f"engine {dead.url} ejected after 1 consecutive failure;" in text, text


def _hypercorn(*flags: str) -> list[str]:
    return [sys.executable, "-m", "hypercorn", "-k", "trio", "--bind",
            f"127.0.0.1:{_free_port()}", *flags, "trioforward.server:create_app()"]


async def test_a_bad_setting_under_the_hypercorn_command_is_one_line() -> None:
    env = {**os.environ, "TRIOFORWARD_ENGINE_CAPACITY": "abc"}
    with trio.fail_after(60):
        spawned = await trio.run_process(_hypercorn(), env=env, capture_stderr=True, check=False)
        in_process = await trio.run_process(
            _hypercorn("--workers", "0"), env=env, capture_stderr=True, check=False
        )
    expected = "Error: setting 'engine_capacity': cannot read as int"
    for result in (spawned, in_process):
        err = result.stderr.decode()
        assert "Traceback" not in err, err
        [line] = [line for line in err.splitlines() if "Error" in line]
        assert line.startswith(expected) and line.endswith("(TRIOFORWARD_ENGINE_CAPACITY)"), err
    assert in_process.returncode == 2
    # Hypercorn 0.18 drops its worker process's exit status (docs/server.md, "Under the
    # hypercorn command"). If this fails, Hypercorn reports it now: update that page.
    assert spawned.returncode == 0
