"""Tracing's cost: the gateway's CPU per request with traces off, on at ratio 1 and on at 0.1, and before tracing existed, in one run.

Four ``trioforward serve`` processes in front of the same instant simulated
engines, each on its own loopback address: ``before`` (the source tree at the
commit before tracing was added, ``--before REV``, exported with ``git
archive``), ``off`` (this tree, no endpoint), ``on-1`` and ``on-0.1`` (this tree,
``--otlp-endpoint`` to a local OTLP/HTTP sink in its own process, which answers
every export 200 and counts the spans; ``--trace-sample-ratio`` 1 and 0.1). The
load generator is ``bench/gateway_burst.py``'s (aiohttp, its own process; a
warm-up burst, then bursts of ``size`` until ``--min-requests``), with no
``traceparent``: the ratio decides. The targets are measured in turn, the order
rotated each round (A/B alternated), for ``--rounds`` rounds; the table gives
the median per target and size. Gateway CPU is user + system of the whole
process, all threads (``/proc/PID/stat``): it includes the export thread's
encoding and HTTP. The sink's CPU is not counted.

    python bench/tracing_cost.py --sizes 256,2048 --rounds 3

Writes ``bench/results/tracing_cost.json``; prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

try:  # `python bench/tracing_cost.py`, or bench/ on sys.path (bench/run_all.py)
    import _targets as targets
except ImportError:  # `python -m bench.tracing_cost`
    from bench import _targets as targets  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BURST = ROOT / "bench" / "gateway_burst.py"
NAMES = ("before", "off", "on-1", "on-0.1")
HOSTS = {"before": "127.0.0.6", "off": "127.0.0.7", "on-1": "127.0.0.8", "on-0.1": "127.0.0.9"}
RATIOS = {"on-1": "1", "on-0.1": "0.1"}

# The OTLP/HTTP sink: answers each POST /v1/traces with an empty
# ExportTraceServiceResponse (200, zero bytes of protobuf) and counts the bytes;
# GET /stats returns {"posts", "bytes"}.
_SINK = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
seen = {"posts": 0, "bytes": 0}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        self.rfile.read(n)
        seen["posts"] += 1; seen["bytes"] += n
        self.send_response(200); self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0"); self.end_headers()
    def do_GET(self):
        body = json.dumps(seen).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def tracing_commit() -> str:
    """The commit that added tracing (the first to have ``trioforward/dispatch/_tracing.py``)."""
    out = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "trioforward/dispatch/_tracing.py"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()
    if not out:
        raise RuntimeError("no commit adds trioforward/dispatch/_tracing.py: give --before REV")
    return out[-1]


def _export_tree(rev: str, into: Path) -> None:
    archive = subprocess.run(["git", "archive", rev, "trioforward"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def _start(name: str, engines: list[str], procs: list[subprocess.Popen[bytes]], sink: str, before_tree: Path) -> dict[str, Any]:
    host = HOSTS[name]
    port = targets.free_port(host)
    args = [sys.executable, "-c", targets.CLI, "serve", "--host", host, "--port", str(port),
            "--no-access-log", "--log-level", "warning"]
    for url in engines:
        args += ["--engine", url]
    if name in RATIOS:
        args += ["--otlp-endpoint", sink, "--trace-sample-ratio", RATIOS[name]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # `python -c` puts the working directory first on sys.path: it picks the tree.
    tree = before_tree if name == "before" else ROOT
    env["PYTHONPATH"] = str(tree)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tree,
                            start_new_session=True, env=env)
    procs.append(proc)
    url = f"http://{host}:{port}"
    targets.wait_serving(url, engines, proc)
    shown = ["python" if a == sys.executable else a for a in args]
    return {"name": name, "urls": [url], "pid": proc.pid, "keep_alive": 75.0, "argv": shown}


def run(sizes: list[int], rounds: int, min_requests: int, before: str | None, n_engines: int = 2) -> dict[str, Any]:
    before = before or f"{tracing_commit()}~1"
    rev = subprocess.run(["git", "rev-parse", "--short", before], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tf-before-") as tmp:
        _export_tree(rev, Path(tmp))
        try:
            engines = targets.start_engines(n_engines, procs)
            sink_port = targets.free_port("127.0.0.1")
            sink = subprocess.Popen([sys.executable, "-c", _SINK, str(sink_port)], start_new_session=True)
            procs.append(sink)
            sink_url = f"http://127.0.0.1:{sink_port}"
            started = [_start(n, engines, procs, sink_url, Path(tmp)) for n in NAMES]
            for r in range(rounds):
                order = started[r % len(started):] + started[: r % len(started)]  # rotated each round
                plan = {"sizes": sizes, "targets": order, "engines": engines, "min_requests": min_requests}
                done = subprocess.run([sys.executable, str(BURST), "--loadgen", json.dumps(plan)], cwd=ROOT,
                                      check=True, stdout=subprocess.PIPE)
                for row in json.loads(done.stdout):
                    rows.append({**row, "round": r})
            _, sink_stats = targets._get(sink_url + "/stats")
        finally:
            for proc in reversed(procs):
                targets.stop(proc)
    report: dict[str, Any] = {
        "benchmark": "tracing_cost",
        "before": rev,
        "sizes": sizes,
        "rounds": rounds,
        "min_requests": min_requests,
        "engines": n_engines,
        "targets": {t["name"]: {"argv": t["argv"]} for t in started},
        "sink": json.loads(sink_stats),
        "method": "per round, each target in turn (order rotated each round), per size: one warm-up burst, then "
        "bursts of `size` concurrent POST /v1/completions (no traceparent) until >= min_requests; gateway CPU = "
        "utime+stime of the gateway process, all threads, over the measured bursts, per request; medians over rounds",
        "results": rows,
    }
    report["medians"] = _medians(report)
    return report


def _medians(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for size in report["sizes"]:
        base = {}
        for name in NAMES:
            mine = [r for r in report["results"] if r["target"] == name and r["size"] == size]
            cpu = statistics.median(r["cpu_per_request_us"] for r in mine)
            base[name] = cpu
            out.append({
                "target": name, "size": size, "cpu_per_request_us": cpu,
                "cpu_us_each_round": [round(r["cpu_per_request_us"], 1) for r in sorted(mine, key=lambda r: r["round"])],
                "p50_ms": statistics.median(r["p50_ms"] for r in mine),
                "throughput_rps": statistics.median(r["throughput_rps"] for r in mine),
                "errors": sum(r["errors"] for r in mine),
            })
        for row in out[-len(NAMES):]:
            row["vs_before"] = row["cpu_per_request_us"] / base["before"]
            row["vs_off"] = row["cpu_per_request_us"] / base["off"]
    return out


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"before = the tree at {report['before']} (before tracing); rounds = {report['rounds']}, medians shown",
        "",
        "| target | in flight | gateway CPU µs/request | per round | vs before | vs off | p50 ms | req/s | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["medians"]:
        lines.append(
            f"| {row['target']} | {row['size']} | {row['cpu_per_request_us']:.0f} | "
            f"{', '.join(f'{v:.0f}' for v in row['cpu_us_each_round'])} | {row['vs_before']:.2f} | "
            f"{row['vs_off']:.2f} | {row['p50_ms']:.1f} | {row['throughput_rps']:.0f} | {row['errors']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,2048", help="comma-separated burst sizes (requests in flight)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each measuring every target (>= 3 for a median)")
    parser.add_argument("--min-requests", type=int, default=4096, help="requests per target, size and round")
    parser.add_argument("--before", default=None, help="the commit to compare with (default: the one before tracing)")
    parser.add_argument("--out", default=str(RESULTS / "tracing_cost.json"))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    report = run(sizes, args.rounds, args.min_requests, args.before)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
