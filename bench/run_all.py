"""Run every benchmark at a size that fits a 2-core machine, then regenerate
``docs/performance.md`` from ``bench/results/*.json``.

    python -m bench.run_all                 # run all (< 15 min on 2 cores), then write the page
    python -m bench.run_all --only pool_cpu,gateway_burst
    python -m bench.run_all --docs-only     # rewrite the page from the JSON already there

Each benchmark's ``main(argv)`` writes ``bench/results/<name>.json`` (and a PNG).
The page has one section per benchmark in a fixed layout: what it measures (the
module docstring's first paragraph), the command and how long it took, the
table (the module's ``format_table(document)`` when it has one, else a table
built from ``document["results"]``), the summary fields (ratios, flatness, ...),
the plot, and a notes block that survives regeneration: text between
``<!-- notes:NAME -->`` and ``<!-- /notes:NAME -->`` is kept as is.

The machine the benchmarks ran on is recorded in ``bench/results/machine.json``
at run time, so ``--docs-only`` describes the machine of the run, not the
current one.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "performance.md"
MACHINE = RESULTS / "machine.json"


@dataclass(frozen=True, slots=True)
class Bench:
    name: str
    title: str
    argv: tuple[str, ...]


# Sizes chosen so the runs together stay under 15 minutes on 2 cores.
BENCHMARKS = (
    Bench("pool_cpu", "Connection pool: client CPU per request vs httpx and aiohttp",
          ("--sizes", "512,2048,8192", "--requests", "16384", "--max-seconds", "20")),
    Bench("gateway_burst", "Gateway bursts vs smg, sglang-router, a reference forwarder and direct",
          ("--sizes", "64,1024,8192", "--min-requests", "4096")),
    Bench("gateway_burst_routes", "Gateway CPU per request on the token routes: /generate and /inference/v1/generate vs /v1/completions",
          ("--sizes", "256,1024", "--min-requests", "4096")),
    Bench("profile_gateway", "Where trioforward's CPU per request goes, layer by layer",
          ("--sizes", "64,8192")),
    Bench("tracing_cost", "Tracing's cost: gateway CPU per request with traces off, on (ratio 1, 0.1) and before tracing",
          ("--sizes", "256,2048", "--rounds", "3", "--min-requests", "4096")),
    Bench("dispatch_queueing", "32,768 requests with engine queueing", ()),
    Bench("futures_scale", "131,072 outstanding Tinker futures", ()),
    Bench("prefix_routing", "Prefix routing vs least-outstanding, round-robin, session and smg", ()),
    Bench("weight_update_continue", "Weight updates mid-rollout: continue vs whole replay vs keep",
          ("--rounds", "3")),
    Bench("oversampling", "Over-sampling: cancel stragglers by group vs wait vs abort-all on the engines", ()),
    Bench("tenant_fairness", "Tenants: a flood and a late tenant, weights 3:1, two fleet members", ()),
    Bench("fleet", "Fleet mode: state_url vs none, Redis vs memory futures, --workers 2 vs 1",
          ("--sizes", "64,1024,8192", "--requests", "4096", "--samples", "8192", "--failover-samples", "20000")),
    Bench("rollout_makespan", "Rollout makespan: trioforward's routing modes vs smg, sglang-router and vllm-router, against the lower bound",
          ("--quick",)),
    Bench("async_rl_staleness", "Async RL with a staleness bound: off-policyness and makespan, bounded vs unbounded; "
          "an engine SIGKILLed mid-step, migration on vs max_migrations 0",
          ()),
)

PACKAGES = ("trio", "h11", "hypercorn", "quart", "quart-trio", "httpx", "aiohttp", "numpy",
            "orjson", "prometheus-client", "openai", "tinker", "fastapi", "uvicorn", "smg", "sglang-router",
            "vllm-router")


def describe_machine() -> dict[str, Any]:
    """CPU model, cores, memory, kernel, Python and package versions, git commit."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    versions = {}
    for name in ("trioforward", *PACKAGES):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "packages": versions,
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def run(selected: list[Bench]) -> dict[str, Any]:
    """Run each benchmark's ``main(argv)``; returns ``{name: {"seconds", "argv", "error"}}``."""
    # `python bench/run_all.py` as well as `python -m bench.run_all`; benchmarks may
    # import their siblings by plain module name.
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    runs: dict[str, Any] = {}
    for bench in selected:
        print(f"== {bench.name} {' '.join(bench.argv)}", flush=True)
        started = time.perf_counter()
        error = None
        try:
            module = importlib.import_module(f"bench.{bench.name}")
            module.main(list(bench.argv))
        except BaseException as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
            if isinstance(exc, KeyboardInterrupt):
                raise
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}"
        took = time.perf_counter() - started
        runs[bench.name] = {"seconds": round(took, 1), "argv": list(bench.argv), "error": error}
        print(f"== {bench.name}: {took:.0f} s{' FAILED: ' + error if error else ''}", flush=True)
    return runs


# -- the page -----------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value).lower()
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(", ", ": "))[:120]
    return str(value).replace("|", "\\|")


def _rows(results: Any) -> list[dict[str, Any]]:
    """Flatten ``results`` (a list of rows, or nested dicts of rows) into rows."""
    if isinstance(results, list):
        return [r if isinstance(r, dict) else {"value": r} for r in results]
    if isinstance(results, dict):
        rows = []
        for key, value in results.items():
            if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
                for sub, row in value.items():
                    rows.append({"key": key, "size": sub, **row})
            elif isinstance(value, dict):
                rows.append({"key": key, **value})
            else:
                rows.append({"key": key, "value": value})
        return rows
    return []


def generic_table(document: dict[str, Any]) -> str:
    """A Markdown table of ``document["results"]``: one row per result, scalar fields only."""
    rows = _rows(document.get("results"))
    if not rows:
        return ""
    columns: list[str] = []
    for row in rows:
        for key, value in row.items():
            if key not in columns and not isinstance(value, (dict, list)):
                columns.append(key)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _summary(document: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, value)`` for every top-level field but the results: scalars, and small
    dicts of scalars (ratios, percentiles) on one line."""
    out = []
    for key, value in document.items():
        if key in ("results", "benchmark"):
            continue
        if isinstance(value, dict) and not value:
            shown = "none"
        elif isinstance(value, dict) and all(not isinstance(v, (dict, list)) for v in value.values()):
            shown = ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items())
        elif isinstance(value, (dict, list)) and len(json.dumps(value)) > 300:
            continue  # too big for one line; it is in the JSON
        else:
            shown = value if isinstance(value, str) else _fmt(value)
        out.append((key, shown))
    return out


def _summary_lines(document: dict[str, Any], has_table: bool) -> list[str]:
    rows = _summary(document)
    if not rows:
        return []
    if has_table:
        return [f"- `{key}`: {value}" for key, value in rows]
    return ["| measure | value |", "|---|---:|", *(f"| `{key}` | {value} |" for key, value in rows)]


def _module_doc(name: str) -> str:
    """The docstring's title and first paragraph, minus run instructions."""
    path = ROOT / "bench" / f"{name}.py"
    try:
        text = path.read_text()
    except OSError:
        return ""
    match = re.match(r'\s*(?:#.*\n)*\s*"""(.*?)"""', text, flags=re.S)
    if not match:
        return ""
    paragraphs = [p.strip() for p in match.group(1).strip().split("\n\n")]
    kept = [p for p in paragraphs[:2] if not p.lower().startswith(("run", "python ")) and "bench/" not in p]
    if len(kept) == 2 and kept[1].endswith(":"):
        kept = kept[:1]  # a lead-in to a list the page does not show
    return " ".join(kept).replace("\n", " ").replace("``", "`")


def _table(name: str, document: dict[str, Any]) -> tuple[str, bool]:
    """The results table, and whether the benchmark's own ``format_table`` made it."""
    try:
        module = importlib.import_module(f"bench.{name}")
        formatter = getattr(module, "format_table", None)
        if formatter is not None:
            text = str(formatter(document))
            if text.lstrip().startswith("|"):
                return text, True
            return "```\n" + text + "\n```", True
    except Exception:  # noqa: BLE001 - fall back to the generic layout
        pass
    return generic_table(document), False


def _old_notes(text: str) -> dict[str, str]:
    return dict(re.findall(r"<!-- notes:(\w+) -->\n(.*?)<!-- /notes:\1 -->", text, flags=re.S))


def render(selected: tuple[Bench, ...] = BENCHMARKS) -> str:
    """The whole of docs/performance.md, from the JSON files and machine.json."""
    machine = json.loads(MACHINE.read_text()) if MACHINE.exists() else describe_machine()
    notes = _old_notes(DOC.read_text()) if DOC.exists() else {}
    runs = machine.get("runs", {})
    packages = ", ".join(f"{k} {v}" for k, v in machine.get("packages", {}).items() if v)
    out = [
        "# Performance",
        "",
        "<!-- GENERATED by `python -m bench.run_all` from bench/results/*.json. Edit only the",
        "     notes blocks (kept across regenerations); everything else is rewritten. -->",
        "",
        "Every figure below was measured in one run of `nox -s bench` (`python -m bench.run_all`),",
        "peers side by side on the same machine at the same time, so compare ratios, not absolute",
        "numbers. CPU time, not wall time, is the measure where the machine may be shared.",
        "",
        "## Machine",
        "",
        f"- CPU: {machine.get('cpu')}, {machine.get('cores')} cores; memory {machine.get('memory_gib')} GiB",
        f"- {machine.get('kernel')}; {machine.get('python')}",
        f"- trioforward commit {machine.get('commit')}, run {machine.get('date')}",
        f"- {packages}",
        "",
    ]
    for bench in selected:
        path = RESULTS / f"{bench.name}.json"
        out += [f"## {bench.title}", "", f"`bench/{bench.name}.py`: {_module_doc(bench.name)}", ""]
        meta = runs.get(bench.name)
        if meta is not None:
            command = " ".join(["python", f"bench/{bench.name}.py", *meta["argv"]])
            out += [f"Command (run by `bench/run_all.py`): `{command}` — took {meta['seconds']:.0f} s.", ""]
        else:
            # Results from a standalone run: its arguments are not known here.
            out += [f"Results of a standalone run of `bench/{bench.name}.py` (not of `bench/run_all.py`).", ""]
        if meta is not None and meta.get("error"):
            out += [f"**This run failed:** `{meta['error']}`", ""]
        if not path.exists():
            out += ["_No results yet: run `python -m bench.run_all`._", ""]
        else:
            document = json.loads(path.read_text())
            table, own = _table(bench.name, document)
            if own:
                # The benchmark chose its figures; add only its explanatory text fields.
                text_fields = {k: v for k, v in document.items() if isinstance(v, str)}
                out += [table, "", *_summary_lines(text_fields, has_table=True), ""]
            else:
                out += [table, "", *_summary_lines(document, has_table=bool(table)), ""]
            if path.with_suffix(".png").exists():
                out += [f"![{bench.name}](../bench/results/{bench.name}.png)", ""]
        out += [f"<!-- notes:{bench.name} -->", notes.get(bench.name, "").rstrip("\n"), f"<!-- /notes:{bench.name} -->", ""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run every benchmark and regenerate docs/performance.md.")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    parser.add_argument("--docs-only", action="store_true", help="only rewrite docs/performance.md")
    args = parser.parse_args(argv)
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = wanted - {b.name for b in BENCHMARKS}
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    selected = [b for b in BENCHMARKS if not wanted or b.name in wanted]
    failed = False
    if not args.docs_only:
        RESULTS.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        runs = run(selected)
        machine = json.loads(MACHINE.read_text()) if MACHINE.exists() and wanted else {}
        machine.update(describe_machine())
        machine.setdefault("runs", {}).update(runs)
        MACHINE.write_text(json.dumps(machine, indent=2) + "\n")
        failed = any(r["error"] for r in runs.values())
        print(f"== all benchmarks: {time.perf_counter() - started:.0f} s", flush=True)
    DOC.write_text(render())
    print(f"wrote {DOC}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
