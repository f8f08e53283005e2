"""``gateway_burst.py --routes``: trioforward's CPU per request on its three
generation routes in one run — ``/v1/completions``, SGLang's ``/generate`` and
vLLM's ``/inference/v1/generate`` (docs/server.md, "Token routes").

One trioforward gateway in front of two instant simulated engines, one of kind
``sglang`` and one vLLM with ``--enable-scale-out`` (so each token route has its
engine; ``/v1/completions`` goes to both). The three routes are measured as
rows of the same load generator (``gateway_burst._measure``: warm-up burst, then
bursts until ``min_requests``), three rounds in alternating order (A B C, C B A,
A B C); the median of the rounds is reported with its ratio to
``/v1/completions`` at the same size. Bodies: the same 4-token prompt and a
4-token budget on each route.

Writes ``bench/results/gateway_burst_routes.json``; prints a table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

try:
    import _targets as targets
except ImportError:
    from bench import _targets as targets  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [101, 7, 2048, 3]
ROUTES = {
    "/v1/completions": ({"model": "sim-base", "prompt": PROMPT, "max_tokens": 4}, '"choices"'),
    "/generate": ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}}, '"output_ids"'),
    "/inference/v1/generate": ({"token_ids": PROMPT, "sampling_params": {"max_tokens": 4}}, '"token_ids"'),
}
ROUNDS = 3


def _engine(procs: list[subprocess.Popen[bytes]], *flags: str) -> str:
    port = targets.free_port("127.0.0.1")
    proc = targets.spawn([sys.executable, "-c", targets.CLI, "sim-engine", "--port", str(port), *flags])
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    targets.wait_health(url, proc)
    return url


def run(sizes: list[int], min_requests: int) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engines = [_engine(procs, "--kind", "sglang"), _engine(procs, "--enable-scale-out")]
        gateway = targets.start("trioforward", engines, procs)
        base = gateway.plan()
        order = list(ROUTES)
        plan_targets = []
        for r in range(ROUNDS):
            for path in order if r % 2 == 0 else reversed(order):
                body, expect = ROUTES[path]
                plan_targets.append({**base, "name": f"{path}#{r}", "path": path, "body": body, "expect": expect})
        plan = {"sizes": sizes, "targets": plan_targets, "engines": engines, "min_requests": min_requests}
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "gateway_burst.py"), "--loadgen", json.dumps(plan)],
            cwd=ROOT, check=True, stdout=subprocess.PIPE,
        )
        rows = json.loads(done.stdout)
    finally:
        for proc in reversed(procs):
            targets.stop(proc)
    summary = []
    for size in sizes:
        medians = {}
        for path in ROUTES:
            cpu = [r["cpu_per_request_us"] for r in rows if r["size"] == size and r["target"].split("#")[0] == path]
            errors = sum(r["errors"] for r in rows if r["size"] == size and r["target"].split("#")[0] == path)
            medians[path] = (statistics.median(cpu), cpu, errors)
        base_cpu = medians["/v1/completions"][0]
        for path, (median, cpu, errors) in medians.items():
            summary.append({"route": path, "size": size, "cpu_per_request_us": median, "rounds_us": cpu,
                            "errors": errors, "ratio_to_completions": median / base_cpu if base_cpu else None})
    return {
        "benchmark": "gateway_burst_routes",
        "cpus": os.cpu_count(),
        "gateway": {"argv": gateway.argv, "engines": ["sim-engine --kind sglang", "sim-engine --enable-scale-out"]},
        "bodies": {p: b for p, (b, _) in ROUTES.items()},
        "method": "one gateway; per size, each route measured as a gateway_burst row (warm-up burst, then bursts "
        "until min_requests; CPU = utime+stime of the gateway process per request), 3 rounds in alternating "
        "order; median of the rounds; ratio to /v1/completions of the same size",
        "min_requests": min_requests,
        "results": rows,
        "summary": summary,
    }


def table(report: dict[str, Any]) -> str:
    lines = [f"{'route':<24} {'size':>6} {'err':>4} {'cpu us/req':>11} {'x completions':>14}"]
    for row in report["summary"]:
        lines.append(
            f"{row['route']:<24} {row['size']:>6} {row['errors']:>4} {row['cpu_per_request_us']:>11.0f} "
            f"{row['ratio_to_completions']:>14.2f}"
        )
    return "\n".join(lines)


def main(sizes: list[int], n_engines: int, min_requests: int) -> dict[str, Any]:
    report = run(sizes, min_requests)
    out = ROOT / "bench" / "results" / "gateway_burst_routes.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(table(report))
    print(f"wrote {out}")
    return report
