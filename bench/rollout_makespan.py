"""Rollout makespan: one RL step through each router on the same engines, against the lower bound.

One RL step as a trainer sends it — GRPO prompt groups (a group's samples share
their prompt) and multi-turn agent sessions, long-tailed output lengths, all
submitted at once — through each system in turn, in front of the same
simulated engines (``trioforward sim-engine`` on 127.0.0.1 with the engine
model: ``--profile h100-llama3-8b``, a KV budget that binds, ``--time-scale``),
each engine's prefix cache and counters reset before every run. Systems:
``trioforward serve`` with each ``routing`` (told the engines' ``max_num_seqs``
as ``engine_capacity``; ``session`` gets the group or session id as
``X-Session-ID``), and smg, sglang-router and vllm-router (PyPI, Rust) in
their cache-aware and least-loaded policies (``least_load`` for smg,
``power_of_two`` for the other two), other knobs at their defaults but a queue
that holds the step. Repeats alternate the systems (each repeat rotates the
order) and the table gives medians.

Measures per system: ``makespan_s`` (first request sent to last answer),
``tokens_per_s`` (output tokens over the makespan), p50/p99 request latency,
``preemptions`` (the engines' ``vllm:num_preemptions_total`` on ``/metrics``,
summed), ``prefix_hit_rate`` (prompt tokens found in the engines' prefix
caches over all prompt tokens looked up, ``/sim/stats``; as vLLM's
``prefix_cache_hits`` / ``queries``, a preempted sequence's recompute counts
too), ``busy_fraction`` (the share of 100 ms samples of ``/metrics`` in which
an engine ran a sequence, averaged over engines), ``engines_cpu_s`` (the
engines' own CPU over the step), ``model_share`` (the busiest engine's
modelled step time, ``busy_seconds`` × ``--time-scale``, over the makespan:
below 1 the machine, not the model, stretched the step; ``model_busiest_s``
itself, and ``model_vs_lower_bound``, read the placement on the model alone)
and ``vs_lower_bound``, the makespan over
``lower_bound_s``: the larger of the whole work at the fleet's best
throughput (the model's step costs summed, each distinct prefix computed
once) and the longest chain alone at batch 1 (a request, or a session's turns
back to back). See docs/performance.md, "Rollout makespan: engine timing and
workload", for the numbers and how to read them.

    python bench/rollout_makespan.py --quick     # <= 3 minutes here
    python bench/rollout_makespan.py             # 8 engines, 32 groups x 8, 16 sessions x 4, outputs to 4,096

Writes ``bench/results/rollout_makespan.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

try:  # `python bench/rollout_makespan.py`, or bench/ on sys.path (bench/run_all.py)
    import _rollout_systems as systems
    import _rollout_workload as rollout
    import _targets as targets
except ImportError:  # `python -m bench.rollout_makespan`
    from bench import _rollout_systems as systems  # type: ignore[no-redef]
    from bench import _rollout_workload as rollout  # type: ignore[no-redef]
    from bench import _targets as targets  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CLI = targets.CLI
SAMPLE_S = 0.1
RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})?\s+([0-9.eE+]+)", re.M)
PREEMPTIONS = re.compile(r"^vllm:num_preemptions_total(?:\{[^}]*\})?\s+([0-9.eE+]+)", re.M)
MOVES = re.compile(r"^trioforward_session_moves_total\s+([0-9.eE+]+)", re.M)


def _engine_argv(port: int, args: Any) -> list[str]:
    argv = [sys.executable, "-c", CLI, "sim-engine", "--port", str(port), "--max-num-seqs", str(args.slots)]
    if args.profile == "flat":
        return argv + ["--prefill-ms-per-token", str(args.prefill_ms), "--decode-ms-per-token",
                       str(args.decode_ms), "--prefix-cache-tokens", str(args.cache_tokens)]
    # The prefix cache lives inside the KV budget (docs/sim.md, "Engine model").
    return argv + ["--profile", args.profile, "--kv-cache-tokens", str(args.kv_cache_tokens),
                   "--prefix-cache-tokens", str(args.kv_cache_tokens), "--time-scale", str(args.time_scale)]


def _bound(work: rollout.Workload, args: Any) -> dict[str, float]:
    if args.profile == "flat":
        return rollout.lower_bound(work, rollout.FlatTiming(args.prefill_ms, args.decode_ms, args.slots),
                                   args.engines)
    from trioforward.sim.physics._physics import PROFILES

    return rollout.model_lower_bound(work, PROFILES[args.profile], args.engines, args.slots,
                                     args.kv_cache_tokens, args.time_scale)


def _engine_doc(args: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"engines": args.engines, "max_num_seqs": args.slots, "profile": args.profile}
    if args.profile == "flat":
        return doc | {"decode_ms": args.decode_ms, "prefill_ms_per_token": args.prefill_ms,
                      "prefix_cache_tokens": args.cache_tokens,
                      "model": "flat: a decode step costs decode_ms whatever the batch"}
    from trioforward.sim.physics._physics import PROFILES

    profile = PROFILES[args.profile]
    return doc | {"kv_cache_tokens": args.kv_cache_tokens, "time_scale": args.time_scale,
                  "step_s": profile.step_s, "seq_s": profile.seq_s, "kv_token_s": profile.kv_token_s,
                  "prefill_token_s": profile.prefill_token_s,
                  "max_num_batched_tokens": profile.max_num_batched_tokens, "source": profile.source}


# --- one run ---------------------------------------------------------------------------


async def _get(session: Any, url: str) -> tuple[int, str]:
    async with session.get(url) as response:
        return response.status, await response.text()


async def _preemptions(session: Any, engines: list[str]) -> int | None:
    """The engines' ``vllm:num_preemptions_total`` summed; None when one serves no ``/metrics``."""
    total = 0.0
    for url in engines:
        status, body = await _get(session, url + "/metrics")
        found = PREEMPTIONS.search(body) if status == 200 else None
        if found is None:
            return None
        total += float(found.group(1))
    return int(total)


async def _sample_busy(session: Any, engines: list[str], out: list[list[bool]]) -> None:
    """Every :data:`SAMPLE_S`, whether each engine runs a sequence
    (``vllm:num_requests_running`` > 0 on ``/metrics``: a few hundred bytes,
    where ``/sim/stats`` serializes every counter)."""
    while True:
        row = []
        for url in engines:
            found = RUNNING.search((await _get(session, url + "/metrics"))[1])
            row.append(found is not None and float(found.group(1)) > 0)
        out.append(row)
        await asyncio.sleep(SAMPLE_S)


async def _moves(session: Any, system: str, url: str) -> int | None:
    """trioforward's ``trioforward_session_moves_total`` (``/metrics``); None for other systems."""
    if not system.startswith("trioforward:"):
        return None
    found = MOVES.search((await _get(session, url + "/metrics"))[1])
    return int(float(found.group(1))) if found else None


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (``/proc/<pid>/stat``
    fields 14 and 15; 0.0 where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(system: str, url: str, engines: list[str], pids: list[int], work: rollout.Workload,
               time_scale: float | None) -> dict[str, Any]:
    """Sends the whole step at once; returns the run's measures."""
    import aiohttp

    headers = system.partition("@")[0] == "trioforward:session"
    latencies: list[float] = []
    tokens = [0]
    errors: list[str] = []

    async def complete(session: Any, prompt: str, max_tokens: int, key: str) -> None:
        body = {"model": "sim-base", "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0}
        start = time.perf_counter()
        async with session.post(url + "/v1/completions", json=body,
                                headers={"x-session-id": key} if headers else {}) as response:
            data = await response.read()
        if response.status != 200:
            errors.append(f"{response.status} {data[:120]!r}")
            return
        latencies.append(time.perf_counter() - start)
        tokens[0] += int(json.loads(data)["usage"]["completion_tokens"])

    async def episode(session: Any, s: int) -> None:
        for t in range(work.turns):
            await complete(session, work.session_prompt(s, t), work.session_outputs[s][t], f"session-{s}")

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as session:
        for engine in engines:
            async with session.post(engine + "/reset_prefix_cache") as response:
                await response.read()
            async with session.post(engine + "/sim/faults", json={"reset_stats": True}) as response:
                await response.read()
        preempted = await _preemptions(session, engines)
        moves = await _moves(session, system, url)
        busy: list[list[bool]] = []
        sampler = asyncio.ensure_future(_sample_busy(session, engines, busy))
        cpu = sum(map(_cpu_s, pids))
        start = time.perf_counter()
        try:
            await asyncio.gather(
                *(complete(session, work.group_prompts[g], o, f"group-{g}")
                  for g in range(work.groups) for o in work.group_outputs[g]),
                *(episode(session, s) for s in range(work.sessions)),
            )
        finally:
            makespan = time.perf_counter() - start
            cpu = sum(map(_cpu_s, pids)) - cpu
            sampler.cancel()
        after = await _preemptions(session, engines)
        moved = await _moves(session, system, url)
        stats = [json.loads((await _get(session, e + "/sim/stats"))[1]) for e in engines]
    cached = sum(s["prompt_tokens_cached"] for s in stats)
    prompt = cached + sum(s["prompt_tokens_computed"] for s in stats)
    lat = sorted(latencies)
    return {
        "system": system,
        "makespan_s": makespan,
        "tokens_per_s": tokens[0] / makespan,
        "output_tokens": tokens[0],
        "requests": len(latencies) + len(errors),
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_ms": 1e3 * lat[len(lat) // 2] if lat else None,
        "p99_ms": 1e3 * lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
        "preemptions": None if preempted is None or after is None else after - preempted,
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
        "busy_fraction": sum(map(sum, busy)) / (len(busy) * len(engines)) if busy else None,
        # The engines' modelled step time (before --time-scale; the sim's
        # busy_seconds), scaled to wall seconds: the makespan if the machine
        # added nothing and the busiest engine never idled.
        # (None for flat timing, which has no steps.)
        "model_busy_s": None if time_scale is None else [float(s["busy_seconds"]) * time_scale for s in stats],
        # The engines' own CPU over the step (all of them): the step loop's
        # work, which the modelled step times do not include.
        "engines_cpu_s": cpu,
        # Wall seconds each engine's step loop fell behind its schedule beyond
        # what it catches up (the sim's lag_seconds, docs/sim.md "Pacing"):
        # time the machine, not the model, added.
        "engine_lag_s": [float(s.get("lag_seconds", 0.0)) for s in stats],
        "requests_per_engine": [int(s["by_path"].get("/v1/completions", 0)) for s in stats],
        # trioforward only: sessions its routing moved off a loaded or saturated engine.
        "session_moves": None if moves is None or moved is None else moved - moves,
    }


# --- the benchmark ---------------------------------------------------------------------


def _median(rows: list[dict[str, Any]], key: str) -> Any:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def _summarise(rows: list[dict[str, Any]], bound: float) -> dict[str, Any]:
    makespan = _median(rows, "makespan_s")
    busiest = [max(r["model_busy_s"]) for r in rows if r.get("model_busy_s")]
    return {
        "model_vs_lower_bound": round(statistics.median(busiest) / bound, 3) if busiest else None,
        "makespan_s": round(makespan, 3),
        "vs_lower_bound": round(makespan / bound, 3),
        "tokens_per_s": round(_median(rows, "tokens_per_s"), 1),
        "p50_ms": _median(rows, "p50_ms"),
        "p99_ms": _median(rows, "p99_ms"),
        "preemptions": _median(rows, "preemptions"),
        "session_moves": _median([{"v": r.get("session_moves")} for r in rows], "v"),
        "requests": rows[0]["requests"],
        "errors": sum(r["errors"] for r in rows),
        "prefix_hit_rate": round(_median(rows, "prefix_hit_rate"), 3),
        "busy_fraction": _median(rows, "busy_fraction"),
        "engines_cpu_s": round(_median(rows, "engines_cpu_s"), 2),
        # The busiest engine's modelled step time (wall seconds): the makespan
        # the model gives this placement if that engine never idled, far less
        # noisy than the wall on a loaded machine; and its share of the wall
        # (1.0 when the step loops ran as the model says).
        "model_busiest_s": _median([{"v": max(r["model_busy_s"]) if r["model_busy_s"] else None}
                                    for r in rows], "v"),
        "model_share": _median([{"v": max(r["model_busy_s"]) / r["makespan_s"] if r["model_busy_s"] else None}
                                for r in rows], "v"),
        "makespans_s": [round(r["makespan_s"], 3) for r in rows],
        "engine_lag_s": _median([{"v": max(r["engine_lag_s"])} for r in rows], "v"),
    }


def format_table(doc: dict[str, Any]) -> str:
    """Markdown: one row per system (medians), the lower bound first."""
    bound = doc["lower_bound"]
    lines = ["| system | makespan s | x bound | busiest engine (model) s | x bound | tokens/s | p50 ms | p99 ms "
             "| preemptions | prefix hits | busy | model share | errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| lower bound (work {bound['work_s']:.2f} s, longest chain {bound['chain_s']:.2f} s) | "
             f"{doc['lower_bound_s']:.2f} | 1.00 | {doc['lower_bound_s']:.2f} | 1.00 | | | | | | | | |"]

    def fmt(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for name, s in doc["systems"].items():
        lines.append(
            f"| {name} | {s['makespan_s']:.2f} | {s['vs_lower_bound']:.2f} | {fmt(s['model_busiest_s'], '.2f')} | "
            f"{fmt(s['model_vs_lower_bound'], '.2f')} | {s['tokens_per_s']:,.0f} | "
            f"{fmt(s['p50_ms'], ',.0f')} | {fmt(s['p99_ms'], ',.0f')} | {fmt(s['preemptions'], ',.0f')} | "
            f"{s['prefix_hit_rate']:.0%} | {fmt(s['busy_fraction'], '.0%')} | {fmt(s['model_share'], '.0%')} | "
            f"{s['errors']} |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="4 engines, 8 groups x 8, 4 sessions x 3, outputs to 512, KV 4,096 tokens (under 3 minutes)")
    p.add_argument("--systems", default=",".join(systems.SYSTEMS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=32)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--slots", type=int, default=64, help="each engine's max_num_seqs")
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--median-output", type=int, default=300)
    p.add_argument("--max-output", type=int, default=4096)
    p.add_argument("--profile", default="h100-llama3-8b",
                   help="the engines' sim-engine --profile, or 'flat' for per-token times")
    p.add_argument("--kv-cache-tokens", type=int, default=16384, help="each engine's KV budget (tokens)")
    p.add_argument("--time-scale", type=float, default=0.3, help="wall seconds per modelled second")
    p.add_argument("--decode-ms", type=float, default=0.5, help="flat: a decode step (ms)")
    p.add_argument("--prefill-ms", type=float, default=0.02, help="flat: a prompt token's prefill (ms)")
    p.add_argument("--cache-tokens", type=int, default=16384, help="flat: each engine's prefix cache (tokens)")
    p.add_argument("--output", type=Path, default=RESULTS / "rollout_makespan.json")
    return p


# Sized to finish in under 3 minutes on the shared 2-core machine (30 runs:
# 10 systems x 3 repeats): 76 requests, 12,352 output tokens, a KV budget that
# makes the work (not one chain) set the bound.
QUICK = {"engines": 4, "slots": 64, "groups": 8, "samples": 8, "sessions": 4, "turns": 3,
         "median_output": 120, "max_output": 512, "kv_cache_tokens": 4096, "time_scale": 0.3}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.quick:  # the quick sizes, unless given explicitly
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in (argv or sys.argv[1:])}
        for key, value in QUICK.items():
            if key not in given:
                setattr(args, key, value)
    work = rollout.draw(args.seed, args.groups, args.samples, args.sessions, args.turns,
                        args.median_output, max_output=args.max_output)
    bound = _bound(work, args)
    chosen = [s for s in args.systems.split(",") if s]
    skipped = {s: "not installed (pip install -e '.[bench]')" for s in chosen if systems.installed(s) is None}
    chosen = [s for s in chosen if s not in skipped]
    procs: list[Any] = []
    runs: list[dict[str, Any]] = []
    started: dict[str, dict[str, Any]] = {}
    took = time.perf_counter()
    load = round(os.getloadavg()[0], 2)
    try:
        engines = targets.start_engines(args.engines, procs, lambda port: _engine_argv(port, args))
        pids = [proc.pid for proc in procs]
        spawned = {system: systems.spawn(system, engines, args.slots, procs) for system in chosen}
        for system, (url, shown, proc) in spawned.items():
            systems.ready(system, url, proc)
            started[system] = {"url": url, "argv": shown, "version": systems.installed(system)}
        for r in range(args.repeats):
            order = chosen[r % len(chosen):] + chosen[:r % len(chosen)]
            for system in order:
                scale = args.time_scale if args.profile != "flat" else None
                row = asyncio.run(_run(system, started[system]["url"], engines, pids, work, scale))
                row["repeat"] = r
                runs.append(row)
                print(f"  {system} #{r}: {row['makespan_s']:.2f} s, {row['errors']} errors", flush=True)
    finally:
        systems.stop_all(procs)
    doc: dict[str, Any] = {
        "benchmark": "rollout_makespan",
        "argv": list(argv if argv is not None else sys.argv[1:]),
        "seconds": round(time.perf_counter() - took, 1),
        # The machine's load average (1 min) when the runs started and ended:
        # the engines' step loops share its cores with everything else.
        "load_average": [load, round(os.getloadavg()[0], 2)],
        "lower_bound_s": round(bound["lower_bound_s"], 3),
        "lower_bound": {k: round(v, 3) for k, v in bound.items()},
        "engine": _engine_doc(args),
        "systems": {s: _summarise([r for r in runs if r["system"] == s], bound["lower_bound_s"])
                    for s in chosen},
        "skipped": skipped,
        "started": {s: {"argv": v["argv"], "version": v["version"]} for s, v in started.items()},
        "workload": work.describe(),
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(format_table(doc))
    return doc


if __name__ == "__main__":
    main()
