"""Dispatch with engine queueing: many more requests than the engines can run at once.

N requests (default 32,768) are submitted at once through the embedded client
(``trioforward.open_client``) to simulated engines running in their own
processes (``trioforward sim-engine``). The engines' total capacity is far below
N, so requests wait in the client's per-engine FIFO queues (QUEUED) for seconds;
the dispatch budget only starts once capacity is acquired, so none should fail.

Reported: failures (target 0), wall time against the physical limit
(requests x engine time / total capacity), the gateway process's CPU time per
request and peak memory (ru_maxrss), and queue-time vs engine-time percentiles.

Run: ``python bench/dispatch_queueing.py [--requests N] [--engines 4] [--capacity 64]
[--decode-ms 20 --max-tokens 8]``. Writes ``bench/results/dispatch_queueing.json``.
``main(argv)`` returns the result dict (for a bench runner).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import trio

import trioforward
from trioforward.errors import TrioforwardError

RESULTS = Path(__file__).parent / "results" / "dispatch_queueing.json"
_LISTENING = re.compile(r"listening on (http://[0-9.]+:[0-9]+)")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=32768, help="requests submitted at once")
    p.add_argument("--engines", type=int, default=4, help="simulated engine processes")
    p.add_argument(
        "--capacity", type=int, default=64, help="capacity per engine (client and engine)"
    )
    p.add_argument(
        "--decode-ms", type=float, default=20.0, help="engine decode time per token (ms)"
    )
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per request")
    p.add_argument(
        "--dispatch-timeout", type=float, default=30.0, help="dispatch budget per request (s)"
    )
    p.add_argument("--output", type=Path, default=RESULTS, help="JSON results file")
    return p.parse_args(argv)


def _start_engines(
    n: int, capacity: int, decode_ms: float
) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    for _ in range(n):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from trioforward.cli import main; main()",
                "sim-engine",
                "--port",
                "0",
                "--capacity",
                str(capacity),
                "--decode-ms-per-token",
                str(decode_ms),
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        procs.append(proc)
    for proc in procs:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()
        match = _LISTENING.search(line)
        if match is None:
            _stop(procs)
            raise RuntimeError(f"sim-engine did not start: {line!r}")
        urls.append(match.group(1))
    return procs, urls


def _stop(procs: list[subprocess.Popen[bytes]]) -> float:
    """Stop the engines; returns their total CPU time (s)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _run(args: argparse.Namespace, urls: list[str]) -> dict[str, Any]:
    n = args.requests
    payload = {"model": "sim-base", "prompt": [1, 2, 3, 4], "max_tokens": args.max_tokens}
    content = orjson.dumps(payload)
    queue = np.full(n, np.nan)
    engine = np.full(n, np.nan)
    failures: dict[str, int] = {}
    statuses: dict[int, int] = {}

    async with trioforward.open_client(
        engines=urls,
        engine_capacity=args.capacity,
        dispatch_timeout=args.dispatch_timeout,
        max_outstanding=0,
    ) as client:
        # Warm the connections (not measured): one request per slot.
        async with trio.open_nursery() as nursery:
            for _ in range(args.capacity * len(urls)):
                nursery.start_soon(
                    lambda: client.post("/v1/completions", json=payload, content=content)
                )

        async def one(i: int) -> None:
            try:
                r = await client.post("/v1/completions", json=payload, content=content)
            except TrioforwardError as exc:
                failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
                return
            statuses[r.status] = statuses.get(r.status, 0) + 1
            if r.status != 200:
                failures[f"status_{r.status}"] = failures.get(f"status_{r.status}", 0) + 1
            queue[i] = r.queue_time
            engine[i] = r.engine_time

        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        stats = client.statistics()

    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    engine_seconds = args.decode_ms * args.max_tokens / 1000.0
    limit = n * engine_seconds / (args.capacity * len(urls))
    ok_q, ok_e = queue[~np.isnan(queue)], engine[~np.isnan(engine)]

    def pct(a: np.ndarray, q: float) -> float | None:
        return round(float(np.percentile(a, q)), 4) if len(a) else None

    return {
        "requests": n,
        "engines": len(urls),
        "capacity_per_engine": args.capacity,
        "engine_time_s": engine_seconds,
        "failures": sum(failures.values()),
        "failures_by_kind": failures,
        "statuses": {str(k): v for k, v in statuses.items()},
        "wall_s": round(wall, 3),
        "physical_limit_s": round(limit, 3),
        "wall_over_limit": round(wall / limit, 3),
        "gateway_cpu_s": round(cpu, 3),
        "gateway_cpu_per_request_us": round(cpu / n * 1e6, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "queue_time_p50_s": pct(ok_q, 50),
        "queue_time_p99_s": pct(ok_q, 99),
        "queue_time_max_s": pct(ok_q, 100),
        "engine_time_p50_s": pct(ok_e, 50),
        "engine_time_p99_s": pct(ok_e, 99),
        "engine_time_mean_s": round(float(ok_e.mean()), 4) if len(ok_e) else None,
        # Share of the engines' capacity-seconds during the run that requests held:
        # near 1 means the gateway kept every slot busy; the rest of any gap between
        # wall time and the physical limit is the engines running slower than modelled.
        "capacity_busy_fraction": round(float(ok_e.sum()) / (wall * args.capacity * len(urls)), 3),
        "retries": {f"{p}/{r}": v for (p, r), v in stats.retries.items()},
        "pool_opened_total": stats.pool.opened_total,
        "cpus": os.cpu_count(),
    }


def format_table(document: dict[str, Any]) -> str:
    """A Markdown table of one run (for docs/performance.md)."""

    def s(key: str) -> str:
        value = document.get(key)
        return "n/a" if value is None else f"{value:g} s"

    rows = [
        ("requests submitted at once", f"{document['requests']:,}"),
        ("engines x capacity", f"{document['engines']} x {document['capacity_per_engine']}"),
        ("engine time per request (model)", s("engine_time_s")),
        ("failures", f"{document['failures']:,}"),
        ("wall time", s("wall_s")),
        ("physical limit (requests x engine time / capacity)", s("physical_limit_s")),
        ("wall / physical limit", f"{document['wall_over_limit']:.2f}x"),
        (
            "queue time p50 / p99 / max",
            f"{s('queue_time_p50_s')} / {s('queue_time_p99_s')} / {s('queue_time_max_s')}",
        ),
        (
            "engine time p50 / p99 / mean",
            f"{s('engine_time_p50_s')} / {s('engine_time_p99_s')} / {s('engine_time_mean_s')}",
        ),
        (
            "capacity busy (engine-time held / capacity x wall)",
            f"{document.get('capacity_busy_fraction', 'n/a')}",
        ),
        ("gateway CPU per request", f"{document['gateway_cpu_per_request_us']:g} us"),
        (f"engines' CPU ({document['engines']} processes)", s("engines_cpu_s")),
        ("peak RSS of the gateway process", f"{document['peak_rss_mb']:g} MiB"),
    ]
    lines = ["| measure | value |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print a table; write the JSON results. Returns the results."""
    args = _parse(argv)
    procs, urls = _start_engines(args.engines, args.capacity, args.decode_ms)
    try:
        result = trio.run(_run, args, urls)
    finally:
        engines_cpu = _stop(procs)
    result["engines_cpu_s"] = round(engines_cpu, 3)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    rows = [
        (
            "requests",
            f"{result['requests']:,} ({result['engines']} engines x {result['capacity_per_engine']})",
        ),
        ("failures", str(result["failures"])),
        (
            "wall / physical limit",
            f"{result['wall_s']:.2f} s / {result['physical_limit_s']:.2f} s = {result['wall_over_limit']:.2f}x",
        ),
        (
            "queue time p50 / p99",
            f"{result['queue_time_p50_s']} s / {result['queue_time_p99_s']} s",
        ),
        (
            "engine time p50 / p99",
            f"{result['engine_time_p50_s']} s / {result['engine_time_p99_s']} s",
        ),
        ("capacity busy", str(result["capacity_busy_fraction"])),
        ("gateway CPU / request", f"{result['gateway_cpu_per_request_us']} us"),
        ("peak RSS", f"{result['peak_rss_mb']} MiB"),
    ]
    width = max(len(k) for k, _ in rows)
    print("dispatch with engine queueing")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print(f"  results: {args.output}")
    return result


if __name__ == "__main__":
    main()
