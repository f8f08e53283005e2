"""Gateway bursts: N concurrent ``POST /v1/completions`` through three targets in one run.

Targets (all subprocesses, each on its own loopback address so their TCP
4-tuples never compete for ephemeral ports):

- ``trioforward``: ``trioforward serve`` (Hypercorn trio worker), default knobs;
- ``reference``: ``bench/reference_forwarder.py`` (uvicorn + FastAPI + aiohttp);
- ``direct``: straight to the engines (the floor: no gateway at all).

Engines are instant simulated engines (``trioforward sim-engine``). The load
generator is an aiohttp client in its own process with one keep-alive session
per target (idle connections kept 1 s less than that server's keep-alive); for
each size it runs a warm-up burst (opens the connections), then measured bursts
of that size, repeated until ``--min-requests`` were sent. Measured: throughput (requests / burst wall time), p50/p99
latency, and the gateway's CPU per request — user+system time of the gateway
process from ``/proc/PID/stat`` before and after the burst, divided by N.

    python bench/gateway_burst.py --sizes 64,256,1024,4096,8192

Writes ``bench/results/gateway_burst.json`` and ``.png``; prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TICKS = os.sysconf("SC_CLK_TCK")
CLI = "from trioforward.cli import main; main()"
BODY = {"model": "sim-base", "prompt": "the quick brown fox", "max_tokens": 4, "temperature": 1.0}


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (``/proc/PID/stat`` fields 14, 15)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout} s")


# --- load generator (its own process) ---------------------------------------------


async def _burst(
    session: Any, urls: list[str], size: int
) -> tuple[float, list[float], int, dict[str, int]]:
    payload = json.dumps(BODY).encode()
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    errors = 0
    kinds: dict[str, int] = {}

    async def one(i: int) -> None:
        nonlocal errors
        url = urls[i % len(urls)] + "/v1/completions"
        start = time.perf_counter()
        try:
            async with session.post(url, data=payload, headers=headers) as response:
                body = await response.read()
                if response.status != 200 or b'"choices"' not in body:
                    errors += 1
                    kinds[f"HTTP {response.status}"] = kinds.get(f"HTTP {response.status}", 0) + 1
                    return
        except Exception as exc:  # noqa: BLE001 - any failure is an error of this target
            errors += 1
            kinds[type(exc).__name__] = kinds.get(type(exc).__name__, 0) + 1
            return
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(size)))
    return time.perf_counter() - start, latencies, errors, kinds


async def _loadgen(plan: dict[str, Any]) -> list[dict[str, Any]]:
    import aiohttp

    out = []
    # Each session keeps idle connections a little less long than its server does
    # (trioforward 75 s; uvicorn and the engines 5 s), as a well-behaved client
    # would: it never reuses a connection the server is closing (that keep-alive
    # race would count as the target's errors), and warm connections carry over
    # from the warm-up burst to the measured ones wherever the server allows it.
    sessions = {
        t["name"]: aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=t["keep_alive"] - 1.0),
            timeout=aiohttp.ClientTimeout(total=300),
        )
        for t in plan["targets"]
    }
    try:
        for size in plan["sizes"]:
            for target in plan["targets"]:
                session, urls, pid = sessions[target["name"]], target["urls"], target["pid"]
                await _burst(session, urls, size)  # warm-up: opens the connections
                # Small bursts are repeated until `min_requests` were sent, so the
                # CPU reading (10 ms ticks) is precise at every size.
                rounds = max(1, -(-plan["min_requests"] // size))
                cpu0 = process_cpu(pid) if pid else 0.0
                wall, latencies, errors, kinds = 0.0, [], 0, {}
                for _ in range(rounds):
                    w, lat, err, k = await _burst(session, urls, size)
                    wall += w
                    latencies += lat
                    errors += err
                    for name, count in k.items():
                        kinds[name] = kinds.get(name, 0) + count
                cpu = (process_cpu(pid) - cpu0) if pid else None
                total = size * rounds
                latencies.sort()
                row = {
                    "target": target["name"], "size": size, "bursts": rounds, "requests": total,
                    "errors": errors, "error_kinds": kinds, "wall_s": wall,
                    "throughput_rps": total / wall,
                    "p50_ms": 1e3 * latencies[len(latencies) // 2] if latencies else None,
                    "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None,
                    "gateway_cpu_s": cpu,
                    "cpu_per_request_us": (1e6 * cpu / total) if cpu is not None else None,
                }
                print(json.dumps(row), file=sys.stderr, flush=True)
                out.append(row)
    finally:
        for session in sessions.values():
            await session.close()
    return out


# --- orchestration ------------------------------------------------------------------


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(sizes: list[int], n_engines: int, targets: list[str], min_requests: int = 8192) -> dict[str, Any]:
    _raise_nofile()
    py = sys.executable
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engines = []
        for _ in range(n_engines):
            port = _free_port("127.0.0.1")
            proc = _spawn([py, "-c", CLI, "sim-engine", "--port", str(port)])
            procs.append(proc)
            engines.append((f"http://127.0.0.1:{port}", proc))
        for url, proc in engines:
            _wait_ready(url, proc)
        engine_urls = [u for u, _ in engines]
        plan_targets = []
        if "trioforward" in targets:
            port = _free_port("127.0.0.2")
            args = [py, "-c", CLI, "serve", "--host", "127.0.0.2", "--port", str(port),
                    "--no-access-log", "--log-level", "warning"]
            for url in engine_urls:
                args += ["--engine", url]
            proc = _spawn(args)
            procs.append(proc)
            _wait_ready(f"http://127.0.0.2:{port}", proc)
            plan_targets.append(
                {"name": "trioforward", "urls": [f"http://127.0.0.2:{port}"], "pid": proc.pid, "keep_alive": 75.0}
            )
        if "reference" in targets:
            port = _free_port("127.0.0.3")
            args = [py, str(ROOT / "bench" / "reference_forwarder.py"), "--host", "127.0.0.3", "--port", str(port)]
            for url in engine_urls:
                args += ["--engine", url]
            proc = _spawn(args)
            procs.append(proc)
            _wait_ready(f"http://127.0.0.3:{port}", proc)
            plan_targets.append(
                {"name": "reference", "urls": [f"http://127.0.0.3:{port}"], "pid": proc.pid, "keep_alive": 5.0}
            )
        if "direct" in targets:
            plan_targets.append({"name": "direct", "urls": engine_urls, "pid": None, "keep_alive": 5.0})
        plan = {"sizes": sizes, "targets": plan_targets, "min_requests": min_requests}
        done = subprocess.run(
            [py, __file__, "--loadgen", json.dumps(plan)], cwd=ROOT, check=True, stdout=subprocess.PIPE
        )
        rows = json.loads(done.stdout)
    finally:
        for proc in reversed(procs):
            _stop(proc)
    return {
        "benchmark": "gateway_burst",
        "request": BODY,
        "engines": n_engines,
        "cpus": os.cpu_count(),
        "note": "reference = uvicorn (asyncio, h11; no uvloop/httptools installed) + FastAPI + aiohttp defaults",
        "method": "per size and target: one warm-up burst, then bursts of `size` concurrent requests repeated "
        "until >= min_requests; throughput = requests / summed burst wall time; gateway CPU = utime+stime "
        "of the gateway process (/proc/PID/stat) over the measured bursts, per request",
        "min_requests": min_requests,
        "results": rows,
        "ratios_to_reference": _ratios(rows),
        "cpu_flatness": _flatness(rows),
    }


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ref = {r["size"]: r for r in rows if r["target"] == "reference"}
    out = []
    for row in rows:
        base = ref.get(row["size"])
        if base is None or row["target"] == "reference":
            continue
        entry: dict[str, Any] = {"target": row["target"], "size": row["size"]}
        for key in ("throughput_rps", "p50_ms", "p99_ms", "cpu_per_request_us"):
            if row.get(key) and base.get(key):
                entry[key] = row[key] / base[key]
        out.append(entry)
    return out


def _flatness(rows: list[dict[str, Any]]) -> dict[str, float]:
    out = {}
    for name in {r["target"] for r in rows if r.get("cpu_per_request_us")}:
        mine = sorted((r["size"], r["cpu_per_request_us"]) for r in rows if r["target"] == name)
        if len(mine) >= 2:
            out[name] = mine[-1][1] / mine[0][1]
    return out


def _table(report: dict[str, Any]) -> str:
    lines = [f"{'target':<12} {'size':>6} {'err':>4} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'CPU us/req':>11} {'thr/ref':>8} {'cpu/ref':>8}"]
    ratios = {(r["target"], r["size"]): r for r in report["ratios_to_reference"]}
    for row in report["results"]:
        ratio = ratios.get((row["target"], row["size"]), {})

        def fmt(value: Any, spec: str) -> str:
            return format(value, spec) if isinstance(value, (int, float)) else "-"

        lines.append(
            f"{row['target']:<12} {row['size']:>6} {row['errors']:>4} {fmt(row['throughput_rps'], '9.0f')} "
            f"{fmt(row['p50_ms'], '9.1f')} {fmt(row['p99_ms'], '9.1f')} {fmt(row['cpu_per_request_us'], '11.0f')} "
            f"{fmt(ratio.get('throughput_rps'), '8.2f')} {fmt(ratio.get('cpu_per_request_us'), '8.2f')}"
        )
    for name, value in sorted(report["cpu_flatness"].items()):
        lines.append(f"CPU per request, largest vs smallest burst, {name}: {value:.2f}x")
    return "\n".join(lines)


def format_table(report: dict[str, Any]) -> str:
    """The results as a Markdown table (used by ``bench/run_all.py`` for docs/performance.md)."""
    ratios = {(r["target"], r["size"]): r for r in report["ratios_to_reference"]}
    lines = [
        "| target | burst | requests | errors | req/s | p50 ms | p99 ms | gateway CPU µs/req | req/s vs ref | CPU vs ref |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def fmt(value: Any, spec: str) -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "–"

    for row in report["results"]:
        ratio = ratios.get((row["target"], row["size"]), {})
        lines.append(
            f"| {row['target']} | {row['size']} | {row.get('requests', row['size'])} | {row['errors']} | "
            f"{fmt(row['throughput_rps'], '.0f')} | {fmt(row['p50_ms'], '.1f')} | {fmt(row['p99_ms'], '.1f')} | "
            f"{fmt(row['cpu_per_request_us'], '.0f')} | {fmt(ratio.get('throughput_rps'), '.2f')} | "
            f"{fmt(ratio.get('cpu_per_request_us'), '.2f')} |"
        )
    return "\n".join(lines)


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name in ("trioforward", "reference", "direct"):
        rows = sorted((r for r in report["results"] if r["target"] == name), key=lambda r: r["size"])
        if not rows:
            continue
        sizes = [r["size"] for r in rows]
        axes[0].plot(sizes, [r["throughput_rps"] for r in rows], "o-", label=name)
        axes[1].plot(sizes, [r["p99_ms"] for r in rows], "o-", label=name)
        if rows[0]["cpu_per_request_us"] is not None:
            axes[2].plot(sizes, [r["cpu_per_request_us"] for r in rows], "o-", label=name)
    titles = ("throughput (req/s)", "p99 latency (ms)", "gateway CPU per request (µs)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests in the burst")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[2].set_ylim(bottom=0)
    fig.suptitle("Gateway bursts against instant simulated engines")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description="Gateway bursts: trioforward vs reference forwarder vs direct.")
    parser.add_argument("--sizes", default="64,256,1024,4096,8192", help="comma-separated burst sizes")
    parser.add_argument("--engines", type=int, default=2, help="simulated engines")
    parser.add_argument("--targets", default="trioforward,reference,direct")
    parser.add_argument(
        "--min-requests", type=int, default=8192, help="repeat smaller bursts until this many requests were sent"
    )
    parser.add_argument("--out", default=str(RESULTS / "gateway_burst.json"))
    parser.add_argument("--loadgen", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loadgen:
        _raise_nofile()
        rows = asyncio.run(_loadgen(json.loads(args.loadgen)))
        print(json.dumps(rows))
        return None
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    report = run(sizes, args.engines, [t.strip() for t in args.targets.split(",")], args.min_requests)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    _plot(report, out.with_suffix(".png"))
    print(_table(report))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return report


if __name__ == "__main__":
    main()
