"""Async RL with and without a staleness bound: how off-policy the consumed rollouts
are, and what the bound costs in makespan.

A small asynchronous RL loop on the physics sims (``trioforward sim-engine
--profile h100-llama3-8b --kv-cache-tokens ... --time-scale ...``, the same
engines as bench/rollout_makespan.py) through the embedded client: the trainer
submits every rollout of the run at once (GRPO groups of 8 sharing a prompt,
long-tailed output lengths drawn by ``_rollout_workload.draw``), consumes them
``step`` at a time in the order they finish, "trains" ``train_s`` wall seconds
per step and then resumes the next weight version (``client.resume(weight_version=...)``):
a weight update every few seconds. Two modes, alternated per repeat:

- ``unbounded``: every rollout starts at once (today's trainer without its own
  throttle);
- ``bounded``: ``client.declare_staleness(step, eta)`` (docs/operations.md,
  "Staleness-bounded admission"): at most ``(i + eta + 1) x step`` start before
  version ``i + 1``; the rest wait at the gateway.

Measures per mode: ``makespan_s`` (first submit to the last step trained), the
**off-policyness** of each consumed rollout (the version index the trainer is
at when it consumes it minus the index the rollout started under) as a
histogram, its mean, p90 and max, and the answers' own ``X-Weight-Staleness``
(versions behind at their end). Medians over repeats.

    python bench/async_rl_staleness.py            # <= 2 minutes here
    python bench/async_rl_staleness.py --quick    # a few seconds (the smoke test)

Writes ``bench/results/async_rl_staleness.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

try:  # `python bench/async_rl_staleness.py`, or bench/ on sys.path (bench/run_all.py)
    import _rollout_workload as rollout
    import _targets as targets
except ImportError:  # `python -m bench.async_rl_staleness`
    from bench import _rollout_workload as rollout  # type: ignore[no-redef]
    from bench import _targets as targets  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODES = ("unbounded", "bounded")


def _engine_argv(port: int, args: Any) -> list[str]:
    return [sys.executable, "-c", targets.CLI, "sim-engine", "--port", str(port),
            "--max-num-seqs", str(args.slots), "--profile", args.profile,
            "--kv-cache-tokens", str(args.kv_cache_tokens),
            "--prefix-cache-tokens", str(args.kv_cache_tokens), "--time-scale", str(args.time_scale)]


async def _run(mode: str, engines: list[str], work: rollout.Workload, args: Any, tag: str) -> dict[str, Any]:
    """One async RL run; returns its measures."""
    from trioforward.dispatch import open_client

    finished: list[tuple[int, int, int | None]] = []  # (rollout, start index, staleness)
    ready = trio.Event()
    index = [0]  # the trainer's version index
    async with open_client(engines, engine_capacity=args.slots, health_interval=3600.0) as client:
        if mode == "bounded":
            client.declare_staleness(tenant="default", step=args.step, eta=args.eta)
        outputs = [(g, o) for g in range(work.groups) for o in work.group_outputs[g]]
        start = time.perf_counter()
        consumed: list[int] = []  # off-policyness of each consumed rollout

        async def one(i: int, group: int, tokens: int) -> None:
            body = {"model": "sim-base", "prompt": f"{tag} " + work.group_prompts[group],
                    "max_tokens": tokens, "temperature": 1.0}
            sent = time.perf_counter()
            answer = await client.post("/v1/completions", json=body, group=f"{tag}-g{group}")
            # The version it started under: the trainer's index when it passed the gate.
            finished.append((i, started_at(sent + answer.admission_time), answer.staleness))
            ready.set()

        timeline: list[tuple[float, int]] = [(time.perf_counter(), 0)]

        def started_at(at: float) -> int:
            return max(i for t, i in timeline if t <= at + 1e-6)

        async def trainer() -> None:
            nonlocal ready
            taken = 0
            while taken < len(outputs):
                while len(finished) - taken < min(args.step, len(outputs) - taken):
                    await ready.wait()
                    ready = trio.Event()
                batch = finished[taken:taken + args.step]
                taken += len(batch)
                consumed.extend(index[0] - s for _, s, _ in batch)
                await trio.sleep(args.train_s)  # the training step
                index[0] += 1
                timeline.append((time.perf_counter(), index[0]))
                await client.resume(weight_version=f"{tag}-v{index[0]}")

        async with trio.open_nursery() as nursery:
            for i, (group, tokens) in enumerate(outputs):
                nursery.start_soon(one, i, group, tokens)
            nursery.start_soon(trainer)
        makespan = time.perf_counter() - start
    hist = Counter(consumed)
    ordered = sorted(consumed)
    staleness = Counter(s for _, _, s in finished if s is not None)
    return {
        "mode": mode,
        "makespan_s": makespan,
        "versions": index[0],
        "off_policy_histogram": {str(k): hist[k] for k in sorted(hist)},
        "off_policy_mean": statistics.fmean(consumed),
        "off_policy_p90": ordered[int(0.9 * (len(ordered) - 1))],
        "off_policy_max": ordered[-1],
        "answer_staleness_histogram": {str(k): staleness[k] for k in sorted(staleness)},
    }


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def format_table(doc: dict[str, Any]) -> str:
    lines = [f"async RL: {doc['rollouts']} rollouts, step {doc['step']}, eta {doc['eta']}, "
             f"train {doc['train_s']} s per step, load {doc['load_average']}",
             f"{'mode':<10} {'makespan s':>10} {'off-policy mean':>16} {'p90':>4} {'max':>4}  histogram"]
    for mode, m in doc["modes"].items():
        lines.append(f"{mode:<10} {m['makespan_s']:>10.2f} {m['off_policy_mean']:>16.2f} "
                     f"{m['off_policy_p90']:>4.0f} {m['off_policy_max']:>4.0f}  {m['off_policy_histogram']}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few seconds: one engine, 32 rollouts")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--slots", type=int, default=32, help="each engine's --max-num-seqs")
    p.add_argument("--groups", type=int, default=32, help="GRPO groups of 8 rollouts")
    p.add_argument("--step", type=int, default=32, help="rollouts the trainer consumes per version")
    p.add_argument("--eta", type=int, default=1, help="the staleness bound (versions)")
    p.add_argument("--train-s", type=float, default=0.5, help="wall seconds of one training step")
    p.add_argument("--median-output", type=int, default=150)
    p.add_argument("--max-output", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--profile", default="h100-llama3-8b")
    p.add_argument("--kv-cache-tokens", type=int, default=16384)
    p.add_argument("--time-scale", type=float, default=0.3)
    p.add_argument("--output", type=Path, default=RESULTS / "async_rl_staleness.json")
    return p


QUICK = {"engines": 1, "groups": 4, "step": 8, "train_s": 0.05, "repeats": 1, "max_output": 64,
         "median_output": 16, "time_scale": 0.05}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    if args.quick:
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in (argv or sys.argv[1:])}
        for key, value in QUICK.items():
            if key not in given:
                setattr(args, key, value)
    work = rollout.draw(args.seed, args.groups, 8, 0, 0, args.median_output, max_output=args.max_output)
    procs: list[Any] = []
    runs: list[dict[str, Any]] = []
    took = time.perf_counter()
    load = round(os.getloadavg()[0], 2)
    try:
        engines = targets.start_engines(args.engines, procs, lambda port: _engine_argv(port, args))
        for r in range(args.repeats):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):  # alternated
                for url in engines:  # a cold prefix cache for every run
                    targets.post_json(url + "/reset_prefix_cache", {})
                row = trio.run(_run, mode, engines, work, args, f"r{r}{mode[0]}")
                row["repeat"] = r
                runs.append(row)
                print(f"  {mode} #{r}: {row['makespan_s']:.2f} s, off-policy max {row['off_policy_max']}",
                      flush=True)
    finally:
        for proc in procs:
            targets.stop(proc)
    modes: dict[str, Any] = {}
    for mode in MODES:
        rows = [r for r in runs if r["mode"] == mode]
        last = rows[len(rows) // 2]
        modes[mode] = {
            "makespan_s": round(_median(rows, "makespan_s"), 3),
            "off_policy_mean": round(_median(rows, "off_policy_mean"), 3),
            "off_policy_p90": _median(rows, "off_policy_p90"),
            "off_policy_max": _median(rows, "off_policy_max"),
            "off_policy_histogram": last["off_policy_histogram"],
            "answer_staleness_histogram": last["answer_staleness_histogram"],
        }
    doc: dict[str, Any] = {
        "benchmark": "async_rl_staleness",
        "argv": list(argv if argv is not None else sys.argv[1:]),
        "seconds": round(time.perf_counter() - took, 1),
        "load_average": [load, round(os.getloadavg()[0], 2)],
        "rollouts": work.groups * 8, "step": args.step, "eta": args.eta, "train_s": args.train_s,
        "engines": args.engines, "max_num_seqs": args.slots, "profile": args.profile,
        "kv_cache_tokens": args.kv_cache_tokens, "time_scale": args.time_scale,
        "bounded_over_unbounded_makespan": round(
            modes["bounded"]["makespan_s"] / modes["unbounded"]["makespan_s"], 3),
        "modes": modes,
        "workload": work.describe(),
        "runs": runs,
    }
    if not args.quick:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(format_table(doc))
    return doc


if __name__ == "__main__":
    main()
