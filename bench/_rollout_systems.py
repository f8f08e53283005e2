"""The systems ``bench/rollout_makespan.py`` compares, and how each is started
(docs/performance.md, "Rollout makespan: engine timing and workload").

``trioforward:<routing>`` is ``trioforward serve`` with that ``routing``, told
the engines' ``max_num_seqs`` as ``engine_capacity``; ``<router>:<policy>`` is
smg, sglang-router or vllm-router (PyPI, Rust) with ``--policy <policy>``,
started by module (two wheels install an ``smg`` script), its other knobs at
their defaults but a queue that holds the whole step. Every process listens
on 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

try:  # bench/ on sys.path (a script, bench/run_all.py)
    import _targets as targets
except ImportError:  # `python -m bench.rollout_makespan`
    from bench import _targets as targets  # type: ignore[no-redef]

__all__ = ["SYSTEMS", "argv", "installed", "ready", "spawn", "stop_all"]

CLI = targets.CLI
SYSTEMS = (
    "trioforward:least-outstanding", "trioforward:round-robin", "trioforward:session", "trioforward:prefix",
    "smg:cache_aware", "smg:least_load", "sglang-router:cache_aware", "sglang-router:power_of_two",
    "vllm-router:cache_aware", "vllm-router:power_of_two",
)
MODULES = {"smg": "smg", "sglang-router": "sglang_router", "vllm-router": "vllm_router.launch_router"}
PACKAGES = {"trioforward": "trioforward", "smg": "smg", "sglang-router": "sglang-router",
            "vllm-router": "vllm-router"}


def argv(system: str, port: int, engines: list[str], slots: int) -> list[str]:
    kind, _, policy = system.partition(":")
    py = sys.executable
    if kind == "trioforward":
        # trioforward:<routing>[@option,...]: auto (adaptive_capacity), static
        # (adaptive_capacity off), cap<N> (engine_capacity N instead of the
        # engines' max_num_seqs), hash (a load factor so wide that sessions and
        # prefixes never leave their rendezvous engine: pure hashing).
        policy, _, options = policy.partition("@")
        capacity = slots
        extra: list[str] = []
        for option in filter(None, options.split(",")):
            if option == "auto":
                extra.append("--adaptive-capacity")
            elif option == "static":
                extra.append("--no-adaptive-capacity")
            elif option.startswith("cap"):
                capacity = int(option[3:])
            elif option == "hash":
                extra += ["--prefix-load-factor", "1000000", "--affinity-floor", "1000000"]
            else:
                raise ValueError(f"unknown trioforward option {option!r} in {system!r}")
        args = [py, "-c", CLI, "serve", "--host", "127.0.0.1", "--port", str(port), "--routing", policy,
                "--engine-capacity", str(capacity), "--no-access-log", "--log-level", "warning", *extra]
        for url in engines:
            args += ["--engine", url]
        return args
    launch = [] if kind == "vllm-router" else ["launch"]
    args = [py, "-m", MODULES[kind], *launch, "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *engines, "--policy", policy, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(targets.free_port("127.0.0.1"))]
    # A queue that holds the whole step: the defaults (smg's 100) would refuse it.
    args += ["--queue-size", "65536"]
    args += ["--log-level", "warning" if kind == "vllm-router" else "warn"]
    return args


def installed(system: str) -> str | None:
    """The package's version, or None when it is not installed."""
    kind = system.partition(":")[0]
    module = MODULES.get(kind, "trioforward").split(".")[0]
    if importlib.util.find_spec(module) is None:
        return None
    return metadata.version(PACKAGES[kind])


def spawn(system: str, engines: list[str], slots: int, procs: list[Any]) -> tuple[str, list[str], Any]:
    port = targets.free_port("127.0.0.1")
    args = argv(system, port, engines, slots)
    proc = targets.spawn(args)
    procs.append(proc)
    return f"http://127.0.0.1:{port}", ["python" if a == sys.executable else a for a in args], proc


def ready(system: str, url: str, proc: Any) -> None:
    """Returns once a completion went through ``url`` (the Rust routers answer
    ``/health`` before their engines are registered)."""
    targets.wait_health(url, proc, timeout=120)
    deadline = time.monotonic() + 120
    while targets.post_json(url + "/v1/completions", targets.READY_BODY, timeout=5)[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{system} answered no completion")
        time.sleep(0.2)


def stop_all(procs: list[Any]) -> None:
    """SIGTERM to every process at once, then SIGKILL to those still up after 10 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 10
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
