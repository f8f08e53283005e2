"""Gateway bursts: N concurrent ``POST /v1/completions`` through each gateway in one run.

Targets (``bench/_targets.py``): trioforward, smg and sglang-router (the Rust
gateways users would pick instead), a Python reference forwarder (uvicorn +
FastAPI + aiohttp), and direct to the engines — each a subprocess on its own
loopback address in front of the same instant simulated engines, with its flags
recorded in the JSON. The load generator is an aiohttp client in its own process
with one keep-alive session per target; for each size it runs a warm-up burst
(opens the connections), then measured bursts of that size, repeated until
``--min-requests`` were sent. Measured: throughput (requests / burst wall time),
p50/p99 latency, the gateway's CPU per request (user+system time of the gateway
process, all its threads, from ``/proc/PID/stat``, over the measured bursts,
divided by the requests), the load generator's own CPU per request (what limits
the run), the gateway's peak RSS, and the connections each engine accepted.
After the bursts a correctness sweep (``bench/_correctness.py``) checks each
target with token-id prompts and a connection dropped after the engine read the
request.

    python bench/gateway_burst.py --sizes 64,256,1024,4096,8192

Writes ``bench/results/gateway_burst.json`` and ``.png``; prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:  # `python bench/gateway_burst.py`, or bench/ on sys.path (bench/run_all.py)
    import _correctness as correctness
    import _targets as targets
except ImportError:  # `python -m bench.gateway_burst`
    from bench import _correctness as correctness  # type: ignore[no-redef]
    from bench import _targets as targets  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TICKS = os.sysconf("SC_CLK_TCK")
CLI = targets.CLI
BODY = {"model": "sim-base", "prompt": "the quick brown fox", "max_tokens": 4, "temperature": 1.0}
# Ratios are given against these targets, when they ran.
BASELINES = ("smg", "reference")

# Kept for the sibling benchmarks that start a gateway the same way.
_free_port = targets.free_port
_spawn = targets.spawn
_stop = targets.stop


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far, all threads (``/proc/PID/stat`` fields 14, 15)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def peak_rss_mib(pid: int) -> float | None:
    """Peak resident set size of ``pid`` (``VmHWM``) in MiB."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    targets.wait_health(url, proc, timeout)


# --- load generator (its own process) ---------------------------------------------


async def _burst(
    session: Any, urls: list[str], size: int, target: dict[str, Any] | None = None
) -> tuple[float, list[float], int, dict[str, int]]:
    # A target may name its own route, body and answer marker (--routes: _token_routes.py).
    target = target or {}
    path = target.get("path") or "/v1/completions"
    expect = (target.get("expect") or '"choices"').encode()
    payload = json.dumps(target.get("body") or BODY).encode()
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    errors = 0
    kinds: dict[str, int] = {}

    async def one(i: int) -> None:
        nonlocal errors
        url = urls[i % len(urls)] + path
        start = time.perf_counter()
        try:
            async with session.post(url, data=payload, headers=headers) as response:
                body = await response.read()
                if response.status != 200 or expect not in body:
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


async def _accepted(stats_session: Any, engines: list[str]) -> list[int]:
    """``connections_accepted`` of each engine, each read on a new connection."""
    out = []
    for engine in engines:
        async with stats_session.get(engine + "/sim/stats") as response:
            out.append(int((await response.json())["connections_accepted"]))
    return out


async def _loadgen(plan: dict[str, Any]) -> list[dict[str, Any]]:
    import aiohttp

    out = []
    # Each session keeps idle connections a little less long than its server does
    # (trioforward 75 s; uvicorn and the engines 5 s), as a well-behaved client
    # would: it never reuses a connection the server is closing (that keep-alive
    # race would count as the target's errors), and warm connections carry over
    # from the warm-up burst to the measured ones wherever the server allows it.
    # One session per target and size, closed after its row: kept open, the idle
    # connections of earlier targets (8192 each at the largest size) exhaust the
    # load generator's file descriptors.
    def new_session(target: dict[str, Any]) -> Any:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=target["keep_alive"] - 1.0),
            timeout=aiohttp.ClientTimeout(total=300),
        )

    engines = plan["engines"]
    stats_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    try:
        for size in plan["sizes"]:
            for target in plan["targets"]:
                session, urls, pid = new_session(target), target["urls"], target["pid"]
                try:
                    row = await _measure(plan, target, session, urls, pid, size, stats_session, engines)
                finally:
                    await session.close()
                print(json.dumps(row), file=sys.stderr, flush=True)
                out.append(row)
    finally:
        await stats_session.close()
    return out


async def _measure(
    plan: dict[str, Any], target: dict[str, Any], session: Any, urls: list[str], pid: int | None,
    size: int, stats_session: Any, engines: list[str],
) -> dict[str, Any]:
    """One row: warm-up burst, then measured bursts of ``size`` through ``session``."""
    accepted0 = await _accepted(stats_session, engines)
    _, _, warmup_errors, warmup_kinds = await _burst(session, urls, size, target)  # opens the connections
    if plan.get("handshake"):  # a profiler attaches between warm-up and measurement
        print("warm", file=sys.stderr, flush=True)
        await asyncio.to_thread(sys.stdin.readline)
    # Small bursts are repeated until `min_requests` were sent, so the
    # CPU reading (10 ms ticks) is precise at every size.
    rounds = max(1, -(-plan["min_requests"] // size))
    cpu0 = process_cpu(pid) if pid else 0.0
    own0 = _self_cpu()
    wall, latencies, errors, kinds = 0.0, [], 0, {}
    for _ in range(rounds):
        w, lat, err, k = await _burst(session, urls, size, target)
        wall += w
        latencies += lat
        errors += err
        for name, count in k.items():
            kinds[name] = kinds.get(name, 0) + count
    cpu = (process_cpu(pid) - cpu0) if pid else None
    own = _self_cpu() - own0
    # Each stats read opens one connection itself: the second read's is
    # counted in its own answer.
    accepted = [b - a - 1 for a, b in zip(accepted0, await _accepted(stats_session, engines), strict=True)]
    total = size * rounds
    latencies.sort()
    row = {
        "target": target["name"], "size": size, "bursts": rounds, "requests": total,
        "errors": errors, "error_kinds": kinds, "warmup_errors": warmup_errors,
        "warmup_error_kinds": warmup_kinds,
        "wall_s": wall, "throughput_rps": total / wall,
        "p50_ms": 1e3 * latencies[len(latencies) // 2] if latencies else None,
        "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None,
        "gateway_cpu_s": cpu,
        "cpu_per_request_us": (1e6 * cpu / total) if cpu is not None else None,
        "loadgen_cpu_per_request_us": 1e6 * own / total,
        "peak_rss_mib": peak_rss_mib(pid) if pid else None,
        "upstream_connections": accepted,
    }
    return row


# --- orchestration ------------------------------------------------------------------


def run(sizes: list[int], n_engines: int, names: list[str], min_requests: int = 8192) -> dict[str, Any]:
    unknown = set(names) - set(targets.NAMES)
    if unknown:
        raise ValueError(f"unknown target(s) {sorted(unknown)}; known: {targets.NAMES}")
    _raise_nofile()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engines = targets.start_engines(n_engines, procs)
        started = [targets.start(name, engines, procs) for name in targets.NAMES if name in names]
        plan = {"sizes": sizes, "targets": [t.plan() for t in started], "engines": engines,
                "min_requests": min_requests}
        done = subprocess.run(
            [sys.executable, __file__, "--loadgen", json.dumps(plan)], cwd=ROOT, check=True,
            stdout=subprocess.PIPE,
        )
        rows = json.loads(done.stdout)
        sweeps = [correctness.sweep(t, engines, rows) for t in started]
    finally:
        for proc in reversed(procs):
            targets.stop(proc)
    return {
        "benchmark": "gateway_burst",
        "request": BODY,
        "engines": n_engines,
        "cpus": os.cpu_count(),
        "targets": {t.name: {"argv": t.argv, "version": t.version} for t in started},
        "note": "reference = uvicorn (asyncio, h11; no uvloop/httptools installed) + FastAPI + aiohttp defaults; "
        "smg and sglang-router: their defaults but --policy round_robin (smg: --queue-size 16384)",
        "method": "per size and target: one warm-up burst, then bursts of `size` concurrent requests repeated "
        "until >= min_requests; throughput = requests / summed burst wall time; gateway CPU = utime+stime "
        "of the gateway process, all threads (/proc/PID/stat), over the measured bursts, per request; "
        "load generator CPU likewise (getrusage of its own process); upstream connections = "
        "connections each engine accepted during the warm-up and measured bursts of that size",
        "min_requests": min_requests,
        "results": rows,
        "correctness": sweeps,
        "ratios": {base: _ratios(rows, base) for base in BASELINES},
        "cpu_flatness": _flatness(rows),
    }


def _ratios(rows: list[dict[str, Any]], base_name: str) -> list[dict[str, Any]]:
    base_rows = {r["size"]: r for r in rows if r["target"] == base_name}
    out = []
    for row in rows:
        base = base_rows.get(row["size"])
        if base is None or row["target"] == base_name:
            continue
        entry: dict[str, Any] = {"target": row["target"], "size": row["size"]}
        for key in ("throughput_rps", "p50_ms", "p99_ms", "cpu_per_request_us"):
            if row.get(key) and base.get(key):
                entry[key] = row[key] / base[key]
        out.append(entry)
    return out


def _flatness(rows: list[dict[str, Any]]) -> dict[str, float]:
    out = {}
    for name in sorted({r["target"] for r in rows if r.get("cpu_per_request_us")}):
        mine = sorted((r["size"], r["cpu_per_request_us"]) for r in rows if r["target"] == name)
        if len(mine) >= 2:
            out[name] = mine[-1][1] / mine[0][1]
    return out


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "–"


def _cpu_ratio(report: dict[str, Any], base: str) -> dict[tuple[str, int], float]:
    ratios = report.get("ratios", {}).get(base, [])
    return {(r["target"], r["size"]): r["cpu_per_request_us"] for r in ratios if "cpu_per_request_us" in r}


def _table(report: dict[str, Any]) -> str:
    vs_smg, vs_ref = _cpu_ratio(report, "smg"), _cpu_ratio(report, "reference")
    lines = [f"{'target':<14} {'size':>6} {'err':>4} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'CPU us':>7} {'/smg':>5} {'/ref':>5} {'lg us':>6} {'RSS MiB':>8}"]
    for row in report["results"]:
        key = (row["target"], row["size"])
        lines.append(
            f"{row['target']:<14} {row['size']:>6} {row['errors']:>4} {_fmt(row['throughput_rps'], '7.0f')} "
            f"{_fmt(row['p50_ms'], '8.1f')} {_fmt(row['p99_ms'], '8.1f')} {_fmt(row['cpu_per_request_us'], '7.0f')} "
            f"{_fmt(vs_smg.get(key), '5.2f')} {_fmt(vs_ref.get(key), '5.2f')} "
            f"{_fmt(row.get('loadgen_cpu_per_request_us'), '6.0f')} {_fmt(row.get('peak_rss_mib'), '8.0f')}"
        )
    for name, value in sorted(report["cpu_flatness"].items()):
        lines.append(f"CPU per request, largest vs smallest burst, {name}: {value:.2f}x")
    if report.get("correctness"):
        lines += ["", correctness.format_sweep(report["correctness"])]
    return "\n".join(lines)


def format_table(report: dict[str, Any]) -> str:
    """The results as Markdown tables (used by ``bench/run_all.py`` for docs/performance.md)."""
    vs_smg, vs_ref = _cpu_ratio(report, "smg"), _cpu_ratio(report, "reference")
    lines = [
        "| target | burst | requests | errors | req/s | p50 ms | p99 ms | gateway CPU µs/req | CPU vs smg "
        "| CPU vs ref | load generator CPU µs/req | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        key = (row["target"], row["size"])
        lines.append(
            f"| {row['target']} | {row['size']} | {row.get('requests', row['size'])} | {row['errors']} | "
            f"{_fmt(row.get('throughput_rps'), '.0f')} | {_fmt(row.get('p50_ms'), '.1f')} | "
            f"{_fmt(row.get('p99_ms'), '.1f')} | {_fmt(row.get('cpu_per_request_us'), '.0f')} | "
            f"{_fmt(vs_smg.get(key), '.2f')} | {_fmt(vs_ref.get(key), '.2f')} | "
            f"{_fmt(row.get('loadgen_cpu_per_request_us'), '.0f')} | {_fmt(row.get('peak_rss_mib'), '.0f')} |"
        )
    flat = report.get("cpu_flatness", {})
    if flat:
        lines += ["", "CPU per request, largest vs smallest burst: "
                  + ", ".join(f"{name}: {value:.2f}x" for name, value in sorted(flat.items()))]
    if report.get("correctness"):
        lines += ["", "Correctness sweep (same run, same engines):", "", correctness.format_sweep(report["correctness"])]
    if report.get("targets"):
        lines += ["", "How each target was started:", ""]
        for name, info in report["targets"].items():
            if info.get("argv"):
                version = f" ({info['version']})" if info.get("version") else ""
                lines.append(f"- {name}{version}: `{' '.join(info['argv'])}`")
    return "\n".join(lines)


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for name in targets.NAMES:
        rows = sorted((r for r in report["results"] if r["target"] == name), key=lambda r: r["size"])
        if not rows:
            continue
        sizes = [r["size"] for r in rows]
        axes[0].plot(sizes, [r["throughput_rps"] for r in rows], "o-", label=name)
        axes[1].plot(sizes, [r["p99_ms"] for r in rows], "o-", label=name)
        if rows[0]["cpu_per_request_us"] is not None:
            axes[2].plot(sizes, [r["cpu_per_request_us"] for r in rows], "o-", label=name)
        # Sizes where a target answered errors: its figures there are not those of forwarding.
        failed = [r for r in rows if r["errors"] > r["requests"] // 100]
        for ax, key in ((axes[0], "throughput_rps"), (axes[2], "cpu_per_request_us")):
            points = [(r["size"], r[key]) for r in failed if r.get(key) is not None]
            if points:
                ax.scatter(*zip(*points, strict=True), s=140, facecolors="none", edgecolors="red", zorder=3)
    loadgen = sorted((r for r in report["results"] if r["target"] == "trioforward"), key=lambda r: r["size"])
    if loadgen and loadgen[0].get("loadgen_cpu_per_request_us") is not None:
        axes[2].plot([r["size"] for r in loadgen], [r["loadgen_cpu_per_request_us"] for r in loadgen],
                     "x--", color="gray", label="load generator (vs trioforward)")
    titles = ("throughput (req/s); red ring: > 1 % errors", "p99 latency (ms)",
              "CPU per request (µs, all threads); red ring: > 1 % errors")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests in the burst")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[2].set_ylim(bottom=0)
    fig.suptitle("Gateway bursts against instant simulated engines (one run, shared 2-core machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description="Gateway bursts: trioforward vs smg, sglang-router, a reference forwarder, direct.")
    parser.add_argument("--sizes", default="64,256,1024,4096,8192", help="comma-separated burst sizes")
    parser.add_argument("--engines", type=int, default=2, help="simulated engines")
    parser.add_argument("--targets", default=",".join(targets.NAMES))
    parser.add_argument(
        "--min-requests", type=int, default=8192, help="repeat smaller bursts until this many requests were sent"
    )
    parser.add_argument("--out", default=str(RESULTS / "gateway_burst.json"))
    parser.add_argument("--loadgen", help=argparse.SUPPRESS)
    parser.add_argument(
        "--routes", action="store_true",
        help="instead: trioforward's CPU per request on /v1/completions, /generate (SGLang) and "
        "/inference/v1/generate (vLLM) in one run (bench/_token_routes.py)",
    )
    args = parser.parse_args(argv)
    if args.loadgen:
        _raise_nofile()
        rows = asyncio.run(_loadgen(json.loads(args.loadgen)))
        print(json.dumps(rows))
        return None
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.routes:
        try:
            import _token_routes as token_routes
        except ImportError:
            from bench import _token_routes as token_routes  # type: ignore[no-redef]
        return token_routes.main(sizes, args.engines, args.min_requests)
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
