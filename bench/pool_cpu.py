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

Every peer/size pair gets its own destination address (127.0.0.2, .3, ...):
one address has ~28k ephemeral ports and a closed connection's port sits in
TIME_WAIT for a minute. The soft RLIMIT_NOFILE is raised to the hard limit.
CPU time, not wall time, is the measure: the machine may be shared.

Run: ``python bench/pool_cpu.py [--sizes 512,2048] [--requests 65536]``.
Writes bench/results/pool_cpu.json and bench/results/pool_cpu.png.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PEERS = ("trioforward", "httpx", "aiohttp")
DEFAULT_SIZES = (512, 2048, 8192, 16384)
BODY = json.dumps(
    {"model": "sim-base", "prompt": [1, 2, 3, 4], "max_tokens": 1, "temperature": 1.0}
).encode()
HEADERS = [(b"content-type", b"application/json")]
TIMEOUT = 300.0


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _quotas(n: int, total: int) -> list[int]:
    """Split ``total`` requests over ``n`` tasks (at least one each)."""
    base, extra = divmod(max(total, n), n)
    return [base + (1 if i < extra else 0) for i in range(n)]


# -- workers: one peer, one size, in its own process ---------------------------


class _Progress:
    """Requests completed in the current phase, and where its CPU clock started.

    A wall-clock cap (``--max-seconds``, for peers whose cost grows with N) may end
    a run early: the figure is then CPU over the requests completed so far
    (a lower bound: the cost per request was still growing) and ``capped`` is set.
    """

    def __init__(self) -> None:
        self.phase = "cold"
        self.done = 0
        self.cpu0 = time.process_time()
        self.wall0 = time.perf_counter()
        self.cold_us: float | None = None

    def start_steady(self, n: int) -> None:
        self.cold_us = (time.process_time() - self.cpu0) / max(self.done, 1) * 1e6
        # Start the steady phase with no collector debt from the warm-up (every peer).
        gc.collect()
        self.phase, self.done = "steady", 0
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def result(self, capped: bool) -> dict[str, Any]:
        cpu = time.process_time() - self.cpu0
        return {
            "requests": self.done,
            "cpu_s": cpu,
            "wall_s": time.perf_counter() - self.wall0,
            "cpu_per_request_us": cpu / max(self.done, 1) * 1e6,
            "cold_cpu_per_request_us": self.cold_us,
            "capped": capped,
            "capped_in": self.phase if capped else None,
        }


async def _trio_phases(one: Any, n: int, total: int, max_seconds: float) -> dict[str, Any]:
    """N tasks: each makes one warm-up request (opening the N connections), then all
    start the steady phase together. The same tasks run both phases, so task
    creation is not in the steady figure. ``one()`` is a peer's request coroutine.
    """
    import trio

    progress = _Progress()
    warm, go = trio.Event(), trio.Event()
    left = [n]

    async def run(quota: int) -> None:
        await one()
        progress.done += 1
        left[0] -= 1
        if not left[0]:
            warm.set()
        await go.wait()
        for _ in range(quota):
            await one()
            progress.done += 1

    with trio.move_on_after(max_seconds) as cap:
        async with trio.open_nursery() as nursery:
            for quota in _quotas(n, total):
                nursery.start_soon(run, quota)
            await warm.wait()
            progress.start_steady(n)
            go.set()
    return progress.result(cap.cancelled_caught)


async def _trioforward(url: str, n: int, total: int, max_seconds: float) -> dict[str, Any]:
    import trio

    from trioforward.http import open_pool

    current_time = trio.current_time
    async with open_pool(idle_expiry=600.0) as pool:
        request = pool.request
        headers: Any = HEADERS

        async def one() -> None:
            response = await request(
                "POST", url, headers=headers, content=BODY, deadline=current_time() + TIMEOUT
            )
            if response.status != 200:
                raise RuntimeError(f"status {response.status}")

        result = await _trio_phases(one, n, total, max_seconds)
        result["opened"] = pool.statistics().opened_total
        return result


async def _httpx(url: str, n: int, total: int, max_seconds: float) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=TIMEOUT) as client:

        async def one() -> None:
            response = await client.post(url, content=BODY, headers=HEADERS)
            if response.status_code != 200:
                raise RuntimeError(f"status {response.status_code}")

        return await _trio_phases(one, n, total, max_seconds)


async def _aiohttp(url: str, n: int, total: int, max_seconds: float) -> dict[str, Any]:
    import asyncio

    import aiohttp

    headers = {"content-type": "application/json"}
    progress = _Progress()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        warm, go = asyncio.Event(), asyncio.Event()
        left = [n]

        async def one() -> None:
            async with session.post(url, data=BODY, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"status {response.status}")
            progress.done += 1

        async def run(quota: int) -> None:
            await one()
            left[0] -= 1
            if not left[0]:
                warm.set()
            await go.wait()
            for _ in range(quota):
                await one()

        async def phases() -> None:
            tasks = [asyncio.ensure_future(run(q)) for q in _quotas(n, total)]
            await warm.wait()
            progress.start_steady(n)
            go.set()
            await asyncio.gather(*tasks)

        try:
            await asyncio.wait_for(phases(), max_seconds)
        except TimeoutError:
            return progress.result(True)
        return progress.result(False)


GC_MODES = {
    # CPython's defaults: (700, 10, 10).
    "default": None,
    # What a long-running gateway process would set at start (same for every peer):
    # young collections every 50k allocations instead of 700. With thousands of
    # requests in flight every object a request keeps across an await survives
    # several 700-allocation collections and is promoted, so CPython's defaults
    # make the collector's share grow with N for any pool (docs/performance.md).
    "tuned": (50_000, 20, 100),
}


def _worker(peer: str, url: str, n: int, total: int, max_seconds: float, gc_mode: str) -> None:
    _raise_fd_limit()
    thresholds = GC_MODES[gc_mode]
    if thresholds is not None:
        gc.set_threshold(*thresholds)
    if peer == "aiohttp":
        import asyncio

        result = asyncio.run(_aiohttp(url, n, total, max_seconds))
    else:
        import trio

        fn = _trioforward if peer == "trioforward" else _httpx
        result = trio.run(fn, url, n, total, max_seconds)
    print(json.dumps(result), flush=True)


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
    parser.add_argument("--gc", default="default,tuned",
                        help=f"garbage-collector settings to run under: {','.join(GC_MODES)}")
    parser.add_argument("--requests", type=int, default=65536,
                        help="steady-phase requests per peer and size (at least N)")
    parser.add_argument("--max-seconds", type=float, default=60.0,
                        help="wall-clock cap of one peer run (then CPU/request over what completed)")
    parser.add_argument("--out", default=str(RESULTS / "pool_cpu.json"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker, args.url, args.n, args.requests, args.max_seconds, args.gc)
        return {}

    _raise_fd_limit()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    peers = [p for p in args.peers.split(",") if p]
    modes = [m for m in args.gc.split(",") if m]
    for mode in modes:
        if mode not in GC_MODES:
            parser.error(f"unknown --gc mode {mode!r}")
    runs = [(mode, n, peer) for mode in modes for n in sizes for peer in peers]
    if len(runs) > 250:
        parser.error("too many runs for one address each (127.0.0.2-127.0.0.251)")
    hosts = [f"127.0.0.{i + 2}" for i in range(len(runs))]
    engine = subprocess.Popen(
        [sys.executable, str(HERE / "_instant_engine.py"), "--hosts", ",".join(hosts)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    results: dict[str, dict[str, dict[str, Any]]] = {m: {p: {} for p in peers} for m in modes}
    try:
        assert engine.stdout is not None
        addresses = json.loads(engine.stdout.readline())["addresses"]
        for (mode, n, peer), (host, port) in zip(runs, addresses, strict=True):
            url = f"http://{host}:{port}/v1/completions"
            started = time.perf_counter()
            row = _run_peer(peer, url, n, args.requests, args.max_seconds, mode)
            results[mode][peer][str(n)] = row
            took = time.perf_counter() - started
            shown = f"{row['cpu_per_request_us']:.1f} us" if "error" not in row else row["error"]
            print(f"  gc={mode:<8} {peer:<12} N={n:<6} {shown}  ({took:.0f} s)",
                  file=sys.stderr, flush=True)
    finally:
        assert engine.stdin is not None
        engine.stdin.close()
        try:
            engine.wait(timeout=10)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()
    document = {
        "benchmark": "pool_cpu",
        "unit": "client CPU microseconds per request (steady phase, keep-alive)",
        "sizes": sizes,
        "requests_per_run": args.requests,
        "max_seconds": args.max_seconds,
        "python": sys.version.split()[0],
        "gc_thresholds": {m: GC_MODES[m] for m in modes},
        "modes": {m: _summarise(results[m], sizes, peers) for m in modes},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(format_tables(document))
    if not args.no_plot:
        _plot(document, out.with_suffix(".png"))
    return document


def _cpu(results: dict[str, dict[str, Any]], peer: str, n: int) -> float | None:
    value = results.get(peer, {}).get(str(n), {}).get("cpu_per_request_us")
    return float(value) if value is not None else None


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


def format_tables(document: dict[str, Any]) -> str:
    """Markdown tables, one per GC mode: CPU us/request (ratio to aiohttp), and the
    largest-N/smallest-N ratio. ``>=`` marks a run cut by ``--max-seconds``."""
    sizes = document["sizes"]
    blocks = []
    for mode, summary in document["modes"].items():
        results = summary["results"]
        thresholds = document["gc_thresholds"][mode]
        title = "CPython default GC" if thresholds is None else f"gc.set_threshold{tuple(thresholds)}"
        lines = [f"{title}:", "",
                 "| peer | " + " | ".join(f"N={n}" for n in sizes)
                 + f" | {max(sizes)}/{min(sizes)} |",
                 "|---|" + "---:|" * (len(sizes) + 1)]
        for peer in results:
            cells = []
            for n in sizes:
                cpu = _cpu(results, peer, n)
                if cpu is None:
                    cells.append("failed")
                    continue
                shown = ("≥" if results[peer][str(n)].get("capped") else "") + f"{cpu:.0f} µs"
                ratio = summary["ratio_to_aiohttp"][peer][str(n)]
                if peer != "aiohttp" and ratio is not None:
                    shown += f" ({ratio:.2f}×)"
                cells.append(shown)
            flat = summary["largest_over_smallest"][peer]
            lines.append(f"| {peer} | " + " | ".join(cells) + (f" | {flat:.2f} |" if flat else " | - |"))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _plot(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    styles = {"default": "-", "tuned": "--"}
    colors = {"trioforward": "tab:blue", "httpx": "tab:orange", "aiohttp": "tab:green"}
    for mode, summary in document["modes"].items():
        results = summary["results"]
        for peer in results:
            xs = [n for n in document["sizes"] if _cpu(results, peer, n) is not None]
            ys = [_cpu(results, peer, n) for n in xs]
            ax.plot(xs, ys, styles.get(mode, ":"), marker="o", color=colors.get(peer),
                    label=f"{peer} (gc {mode})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("requests in flight (N)")
    ax.set_ylabel("client CPU per request (µs, log)")
    ax.set_title("HTTP/1.1 pool CPU per request (keep-alive, instant engine)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
