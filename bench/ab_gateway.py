"""A/B of trioforward trees (or settings) in one run, against smg, alternating.

Each ``--variant LABEL:VAR=VALUE[,VAR=VALUE...]`` is a ``trioforward serve``
started with those environment variables (e.g. ``PYTHONPATH=/tmp/tree-a`` for
another checkout, ``TRIOFORWARD_H11=pure``) on its own loopback address; smg is
started once beside them; the simulated engines and the load generator are
``bench/gateway_burst.py``'s, the same for every variant. Each round measures
every size for every variant and smg (one warm-up burst, then bursts until
``--min-requests``), the variants' order reversed every other round (A B, B A,
...) so a drift of the shared machine does not favour one. Reported per variant
and size: the median over rounds of gateway CPU per request, of its ratio to
smg's in the same round, and of its ratio to the first variant in the same
round; every round's figures are in the JSON.

    python bench/ab_gateway.py --variant base:PYTHONPATH=/tmp/a --variant new:PYTHONPATH=/tmp/b
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _targets as targets  # noqa: E402
from bench import gateway_burst  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _parse_variant(text: str) -> tuple[str, dict[str, str]]:
    label, _, assignments = text.partition(":")
    env = {}
    for item in filter(None, assignments.split(",")):
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: {item!r} is not VAR=VALUE")
        env[name] = value
    return label, env


def _start_variant(
    label: str, env: dict[str, str], host: str, engines: list[str], procs: list[subprocess.Popen[bytes]]
) -> targets.Target:
    port = targets.free_port(host)
    args, keep_alive = targets._argv("trioforward", host, port, engines)
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=targets.ROOT,
        start_new_session=True, env={**os.environ, **env},
    )
    procs.append(proc)
    url = f"http://{host}:{port}"
    targets.wait_serving(url, engines, proc)
    return targets.Target(f"trioforward:{label}", [url], proc.pid, keep_alive, ["env", *(f"{k}={v}" for k, v in env.items()), *args[1:]], None)


def _load() -> float:
    return os.getloadavg()[0]


def run(variants: list[tuple[str, dict[str, str]]], sizes: list[int], rounds: int, min_requests: int,
        engines_n: int = 2) -> dict[str, Any]:
    gateway_burst._raise_nofile()
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[dict[str, Any]] = []
    loads: list[float] = []
    try:
        engines = targets.start_engines(engines_n, procs)
        started = [
            _start_variant(label, env, f"127.0.0.{10 + i}", engines, procs)
            for i, (label, env) in enumerate(variants)
        ]
        smg = targets.start("smg", engines, procs)
        for r in range(rounds):
            order = started if r % 2 == 0 else started[::-1]
            plan = {"sizes": sizes, "targets": [t.plan() for t in [*order, smg]], "engines": engines,
                    "min_requests": min_requests}
            loads.append(_load())
            began = time.time()
            done = subprocess.run(
                [sys.executable, gateway_burst.__file__, "--loadgen", json.dumps(plan)],
                cwd=targets.ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
            for row in json.loads(done.stdout):
                row["round"] = r
                rows.append(row)
            print(f"round {r + 1}/{rounds} took {time.time() - began:.0f} s (load {loads[-1]:.1f})",
                  file=sys.stderr, flush=True)
        loads.append(_load())
    finally:
        for proc in reversed(procs):
            targets.stop(proc)
    names = [t.name for t in started]
    return {
        "benchmark": "ab_gateway",
        "variants": {t.name: t.argv for t in started},
        "sizes": sizes,
        "rounds": rounds,
        "min_requests": min_requests,
        "load_average": loads,
        "results": rows,
        "summary": _summary(rows, names, sizes, rounds),
    }


def _summary(rows: list[dict[str, Any]], names: list[str], sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    cpu = {(r["target"], r["size"], r["round"]): r.get("cpu_per_request_us") for r in rows}
    errors = {}
    for r in rows:
        key = (r["target"], r["size"])
        errors[key] = errors.get(key, 0) + int(r.get("errors", 0)) + int(r.get("warmup_errors", 0))
    out = []
    for name in [*names, "smg"]:
        for size in sizes:
            mine = [cpu.get((name, size, k)) for k in range(rounds)]
            smg = [cpu.get(("smg", size, k)) for k in range(rounds)]
            first = [cpu.get((names[0], size, k)) for k in range(rounds)]
            vs_smg = [a / b for a, b in zip(mine, smg, strict=True) if a and b]
            vs_first = [a / b for a, b in zip(mine, first, strict=True) if a and b]
            values = [v for v in mine if v]
            out.append({
                "target": name, "size": size,
                "cpu_us": statistics.median(values) if values else None,
                "cpu_us_runs": mine,
                "vs_smg": statistics.median(vs_smg) if vs_smg else None,
                "vs_smg_runs": vs_smg,
                "vs_first": statistics.median(vs_first) if vs_first else None,
                "vs_first_runs": vs_first,
                "errors": errors.get((name, size), 0),
            })
    return out


def format_table(report: dict[str, Any]) -> str:
    first = next(iter(report["variants"]))
    lines = [f"| target | burst | CPU µs/req (median) | runs | vs smg | vs {first} | errors |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for s in report["summary"]:
        runs = " / ".join(f"{v:.0f}" if v else "-" for v in s["cpu_us_runs"])
        vs_smg = f"{s['vs_smg']:.2f}" if s["vs_smg"] and s["target"] != "smg" else "–"
        vs_first = f"{s['vs_first']:.3f}" if s["vs_first"] and s["target"] not in (first, "smg") else "–"
        cpu = f"{s['cpu_us']:.0f}" if s["cpu_us"] else "-"
        lines.append(f"| {s['target']} | {s['size']} | {cpu} | {runs} | {vs_smg} | {vs_first} | {s['errors']} |")
    loads = ", ".join(f"{v:.1f}" for v in report["load_average"])
    lines.append(f"\nload average (1 min) at each round's start and the end: {loads}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", required=True, help="LABEL:VAR=VALUE[,VAR=VALUE...]")
    parser.add_argument("--sizes", default="64,1024,8192")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-requests", type=int, default=4096)
    parser.add_argument("--out", required=True, help="JSON path (e.g. bench/results/ab/NAME.json)")
    args = parser.parse_args(argv)
    variants = [_parse_variant(v) for v in args.variant]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    report = run(variants, sizes, args.rounds, args.min_requests)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(format_table(report))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
