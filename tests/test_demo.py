"""`trioforward demo`, short: every client and every scenario step, zero failures.

Runs the real command in a subprocess (its own trio run, SDK threads and open
files limit), with a small burst so it fits the test suite's budget on 2 cores.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

CLI = "from trioforward.cli import main; main()"


def run_demo(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``trioforward demo --duration 8 --burst 200 *args``: the finished process and its
    JSON report, after asserting it exited 0 with no failed request."""
    out = tmp_path / "demo.json"
    done = subprocess.run(
        [sys.executable, "-c", CLI, "demo", *args, "--duration", "8", "--burst", "200",
         "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,  # fail-safe only
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["failures"] == 0, report["failure_examples"]
    return done, report


def test_demo_short_run_has_no_failures(tmp_path: Path) -> None:
    done, report = run_demo(tmp_path)
    assert report["ok"] and all(report["checks"].values())
    requests = report["requests"]
    for api in ("openai completions", "openai chat", "openai stream", "tinker base", "tinker lora", "trainer (httpx)"):
        assert requests.get(api, 0) > 0, f"no {api} requests: {requests}"
    assert requests["burst"] == 200
    assert report["succeeded"] == sum(requests.values())
    # The LoRA adapter was loaded on demand, by the gateway and/or the engines' lazy resolver.
    assert report["adapter_loads"]["engines"] >= 1
    scenario = report["scenario"]
    assert scenario["pause"]["held"] and scenario["pause"]["completed_before_resume"] == 0
    # The weight update paused the engines themselves and recorded a version.
    assert scenario["pause"]["engine_kinds"] == ["vllm"]
    assert scenario["pause"]["weight_version"] == "step-1"
    assert scenario["pause"]["answers_with_version"] > 0
    assert scenario["engine_restart"]["completed_after_restart"] > 0
    assert report["metrics_url"].endswith("/metrics")
    assert "0 failures" in done.stdout


def test_demo_with_two_workers_runs_one_fleet_with_no_failures(tmp_path: Path) -> None:
    # The gateway as `trioforward serve --workers 2` (a child process, a private Valkey).
    done, report = run_demo(tmp_path, "--workers", "2")
    assert report["ok"] and report["checks"]["every worker a fleet member"]
    fleet = report["scenario"]["fleet"]
    assert report["workers"] == fleet["workers"] == fleet["members"] == 2 and len(set(fleet["pids"])) == 2
    assert sorted(fleet["shares"]) == sorted(report["engines"])
    assert all(len(parts) == 2 and sum(parts) <= 16 for parts in fleet["shares"].values())
    assert report["requests"]["burst"] == 200 and report["scenario"]["pause"]["held"]
    assert "2 worker processes in one fleet" in done.stdout


def test_demo_help_lists_its_flags() -> None:
    done = subprocess.run([sys.executable, "-c", CLI, "demo", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for flag in ("--engines COUNT", "--duration SECONDS", "--json FILE", "--engine URL",
                 "--burst REQUESTS", "--port PORT", "--workers COUNT"):
        assert flag in done.stdout, flag


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, "demo", *args], capture_output=True, text=True, timeout=120
    )


def test_demo_refuses_a_taken_port_and_a_missing_json_directory(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _demo("--port", str(port), "--duration", "5")
    assert done.returncode == 2 and "is not free" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    done = _demo("--json", str(tmp_path / "missing" / "x.json"), "--duration", "5")
    assert done.returncode == 2 and "does not exist" in done.stderr, done.stderr[-2000:]


def test_demo_against_a_dead_engine_says_so_without_a_traceback() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    done = _demo("--engine", dead, "--duration", "5")
    assert done.returncode == 1
    assert "no engine listed a model" in done.stderr and dead in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_the_shortest_demo_drives_every_client(tmp_path: Path) -> None:
    # The SDKs are imported before the clock starts: an import takes seconds on a
    # busy machine, and an SDK thread still importing when the traffic stopped
    # made no request ("every client made requests" failed, exit 1).
    out = tmp_path / "demo.json"
    done = _demo("--duration", "2", "--burst", "0", "--json", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    requests = json.loads(out.read_text())["requests"]
    for api in ("openai completions", "openai chat", "openai stream", "tinker base", "trainer (httpx)"):
        assert requests.get(api, 0) > 0, f"no {api} requests: {requests}"
