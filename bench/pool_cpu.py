"""Client CPU seconds per request: trioforward's pool vs httpx vs aiohttp.

An instant HTTP/1.1 engine (bench/_instant_engine.py) runs in its own process.
For each N in flight (default 512, 2048, 8192, 16384) each peer runs in a
fresh subprocess: N tasks each open a keep-alive connection (one warm-up POST
each, measured separately as ``cold``), then the N tasks POST a small JSON
completion request over and over until ``--requests`` have completed; the
worker's CPU time (``time.process_time``: user + system, all threads) over
that steady phase divided by the requests completed is the figure.

Peers: ``trioforward`` (trioforward.http.open_pool, under trio, with a 300 s
deadline per request), ``httpx`` (httpx.AsyncClient, unlimited Limits, 300 s
timeout, under trio via anyio), ``aiohttp`` (ClientSession with
TCPConnector(limit=0), default 300 s total timeout, under asyncio).

Each set of runs is repeated under CPython's default garbage-collector
settings and under the gateway's (``gc.freeze()`` then
``gc.set_threshold(20_000, 1_000, 100)``, as ``trioforward serve`` does),
the same for every peer (``--gc``). A peer whose run exceeds ``--max-seconds`` of wall time
is stopped there; its figure is then CPU over the requests completed so far
and marked ``≥`` (httpx's pool scans every connection per request: at
thousands in flight it does not finish its warm-up in time).

Every peer/size pair gets its own destination address (127.0.0.2, .3, ...):
one address has ~28k ephemeral ports and a closed connection's port sits in
TIME_WAIT for a minute. The soft RLIMIT_NOFILE is raised to the hard limit.
CPU time, not wall time, is the measure: the machine may be shared.

Run: ``python bench/pool_cpu.py [--sizes 512,2048] [--requests 65536]``.
Writes bench/results/pool_cpu.json and bench/results/pool_cpu.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:  # `python bench/pool_cpu.py`, or bench/ on sys.path (bench/run_all.py)
    import pool_cpu_peers as workers
except ImportError:  # `python -m bench.pool_cpu`
    from bench import pool_cpu_peers as workers  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PEERS = ("trioforward", "httpx", "aiohttp")
DEFAULT_SIZES = (512, 2048, 8192, 16384)
GC_MODES = workers.GC_MODES


# -- the driver ------------------------------------------------------------------


def _run_peer(
    peer: str, url: str, n: int, total: int, max_seconds: float, gc_mode: str
) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", peer, "--url", url,
           "--n", str(n), "--requests", str(total), "--max-seconds", str(max_seconds),
           "--gc", gc_mode]
    path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=max_seconds * 4 + 600)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {proc.returncode}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the JSON document it writes. See the module docstring."""
    parser = argparse.ArgumentParser(description="pool CPU per request vs httpx and aiohttp")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="comma-separated in-flight counts")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--gc", default="default,gateway",
                        help=f"garbage-collector settings to run under: {','.join(GC_MODES)}")
    parser.add_argument("--requests", type=int, default=65536,
                        help="steady-phase requests per peer and size (at least N)")
    parser.add_argument("--max-seconds", type=float, default=60.0,
                        help="wall-clock cap of one peer run (then CPU/request over what completed)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per peer, size and GC setting; the median is reported")
    parser.add_argument("--out", default=str(RESULTS / "pool_cpu.json"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--render-only", action="store_true",
                        help="re-summarise, print and plot the JSON at --out without running")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        workers.run_worker(args.worker, args.url, args.n, args.requests, args.max_seconds, args.gc)
        return {}

    if args.render_only:
        out = Path(args.out)
        document = json.loads(out.read_text())
        for summary in document["modes"].values():
            summary.update(_summarise(summary["results"], document["sizes"],
                                      list(summary["results"])))
        document.update(_headline(document))
        out.write_text(json.dumps(document, indent=2) + "\n")
        print(format_table(document))
        if not args.no_plot:
            _plot(document, out.with_suffix(".png"))
        return document

    workers.raise_fd_limit()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    peers = [p for p in args.peers.split(",") if p]
    modes = [m for m in args.gc.split(",") if m]
    for mode in modes:
        if mode not in GC_MODES:
            parser.error(f"unknown --gc mode {mode!r}")
    runs = [(mode, n, peer) for mode in modes for n in sizes for peer in peers]
    if len(runs) * args.repeats > 250:
        parser.error("too many runs for one address each (127.0.0.2-127.0.0.251)")
    hosts = [f"127.0.0.{i + 2}" for i in range(len(runs) * args.repeats)]
    engine = subprocess.Popen(
        [sys.executable, str(HERE / "_instant_engine.py"), "--hosts", ",".join(hosts)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    results: dict[str, dict[str, dict[str, Any]]] = {m: {p: {} for p in peers} for m in modes}
    try:
        assert engine.stdout is not None
        addresses = json.loads(engine.stdout.readline())["addresses"]
        free = iter(addresses)
        for mode, n, peer in runs:
            rows = []
            for _ in range(args.repeats):
                host, port = next(free)
                url = f"http://{host}:{port}/v1/completions"
                started = time.perf_counter()
                row = _run_peer(peer, url, n, args.requests, args.max_seconds, mode)
                took = time.perf_counter() - started
                shown = f"{row['cpu_per_request_us']:.1f} us" if "error" not in row else row["error"]
                print(f"  gc={mode:<8} {peer:<12} N={n:<6} {shown}  ({took:.0f} s)",
                      file=sys.stderr, flush=True)
                rows.append(row)
                if "error" in row or row.get("capped"):
                    break  # a capped run is a lower bound already; repeating it says nothing
            results[mode][peer][str(n)] = _median_row(rows)
    finally:
        assert engine.stdin is not None
        engine.stdin.close()
        try:
            engine.wait(timeout=10)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()
    given = sys.argv[1:] if argv is None else argv
    document = {
        "benchmark": "pool_cpu",
        "command": " ".join(["python bench/pool_cpu.py", *given]),
        "unit": "client CPU microseconds per request (steady phase, keep-alive)",
        "sizes": sizes,
        "requests_per_run": args.requests,
        "max_seconds": args.max_seconds,
        "repeats": args.repeats,
        "python": sys.version.split()[0],
        "gc_thresholds": {m: GC_MODES[m] for m in modes},
        "modes": {m: _summarise(results[m], sizes, peers) for m in modes},
    }
    document.update(_headline(document))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(format_table(document))
    if not args.no_plot:
        _plot(document, out.with_suffix(".png"))
    return document


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median CPU per request; ``repeats`` lists every run's figure."""
    good = [r for r in rows if "error" not in r]
    if not good:
        return rows[-1]
    good.sort(key=lambda r: float(r["cpu_per_request_us"]))
    median = dict(good[(len(good) - 1) // 2])
    median["repeats"] = [round(float(r["cpu_per_request_us"]), 2) for r in rows if "error" not in r]
    return median


def _cpu(results: dict[str, dict[str, Any]], peer: str, n: int) -> float | None:
    """CPU µs per request, or None (failed, or nothing completed before the cap)."""
    row = results.get(peer, {}).get(str(n), {})
    value = row.get("cpu_per_request_us")
    if value is None or row.get("requests") == 0:
        return None
    return float(value)


def _summarise(
    results: dict[str, dict[str, Any]], sizes: list[int], peers: list[str]
) -> dict[str, Any]:
    ratios: dict[str, dict[str, float | None]] = {}
    flatness: dict[str, float | None] = {}
    for peer in peers:
        ratios[peer] = {}
        for n in sizes:
            mine, ref = _cpu(results, peer, n), _cpu(results, "aiohttp", n)
            ratios[peer][str(n)] = mine / ref if mine is not None and ref else None
        lo, hi = _cpu(results, peer, min(sizes)), _cpu(results, peer, max(sizes))
        flatness[peer] = hi / lo if lo and hi is not None else None
    return {"results": results, "ratio_to_aiohttp": ratios, "largest_over_smallest": flatness}


def format_table(document: dict[str, Any]) -> str:
    """One Markdown table: CPU µs/request per peer, GC mode and N (ratio to aiohttp
    under the same GC), and the largest-N/smallest-N ratio. ``≥`` marks a run cut
    by ``--max-seconds`` (a lower bound; "(warm-up)": it had not even finished
    opening its N connections, so the figure includes connects)."""
    sizes = document["sizes"]
    lines = ["| peer | GC | " + " | ".join(f"N={n}" for n in sizes)
             + f" | {max(sizes)}/{min(sizes)} |",
             "|---|---|" + "---:|" * (len(sizes) + 1)]
    for mode, summary in document["modes"].items():
        results = summary["results"]
        for peer in results:
            cells = []
            for n in sizes:
                cpu = _cpu(results, peer, n)
                row = results[peer].get(str(n), {})
                if cpu is None:
                    cells.append("none done in the cap" if row.get("capped") else "failed")
                    continue
                shown = ("≥" if row.get("capped") else "") + f"{cpu:,.0f} µs"
                if row.get("capped_in") == "cold":
                    shown += " (warm-up)"
                ratio = summary["ratio_to_aiohttp"][peer][str(n)]
                if peer != "aiohttp" and ratio is not None and not row.get("capped"):
                    shown += f" ({ratio:.2f}×)"
                cells.append(shown)
            flat = summary["largest_over_smallest"][peer]
            lines.append(f"| {peer} | {mode} | " + " | ".join(cells)
                         + (f" | {flat:.2f} |" if flat else " | - |"))
    return "\n".join(lines)


def _headline(document: dict[str, Any]) -> dict[str, Any]:
    """Small top-level summaries (one line each on the generated page)."""
    sizes = document["sizes"]
    flat: dict[str, float | None] = {}
    versus: dict[str, float | None] = {}
    for mode, summary in document["modes"].items():
        for peer, value in summary["largest_over_smallest"].items():
            flat[f"{peer} gc={mode}"] = round(value, 3) if value else None
        for n in sizes:
            value = summary["ratio_to_aiohttp"].get("trioforward", {}).get(str(n))
            versus[f"gc={mode} N={n}"] = round(value, 3) if value else None
    return {
        f"cpu_{max(sizes)}_over_{min(sizes)}": flat,
        "trioforward_over_aiohttp": versus,
    }


def _plot(document: dict[str, Any], path: Path) -> None:
    """Left: linear axis without the capped runs; right: everything, log axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.4))
    styles = {"default": "-", "gateway": "--"}
    colors = {"trioforward": "tab:blue", "httpx": "tab:orange", "aiohttp": "tab:green"}
    for ax, log in zip(axes, (False, True), strict=True):
        for mode, summary in document["modes"].items():
            results = summary["results"]
            for peer in results:
                xs = [n for n in document["sizes"] if _cpu(results, peer, n) is not None
                      and (log or not results[peer][str(n)].get("capped"))]
                if not xs:
                    continue
                ys = [_cpu(results, peer, n) for n in xs]
                ax.plot(xs, ys, styles.get(mode, ":"), marker="o", color=colors.get(peer),
                        label=f"{peer} (gc {mode})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests in flight (N)")
        ax.grid(True, which="both", alpha=0.3)
        if log:
            ax.set_yscale("log")
            ax.set_title("all peers (httpx: lower bounds, capped)")
            ax.set_ylabel("client CPU per request (µs, log)")
        else:
            ax.set_ylim(bottom=0)
            ax.set_title("uncapped runs")
            ax.set_ylabel("client CPU per request (µs)")
            ax.legend(fontsize=8)
    fig.suptitle("HTTP/1.1 pool: client CPU per request (keep-alive, instant engine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
