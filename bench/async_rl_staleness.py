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

Then the engine-kill cases (``--cases kill`` alone; ``bench/_rl_kill.py``), in
the ``bounded`` mode: the first engine is SIGKILLed once it has decoded half
its share of a step's tokens in step 0 (a token count read from its ``GET
/sim/stats``, not a timer), with ``max_migrations`` at its default 2
(``kill_migrate``) and at 0 (``kill_no_migration``, the 502 of before); both
with ``assemble_answers`` on, so a whole ``/v1/completions`` answer broken off
has tokens to migrate from (docs/operations.md, "Migration"). Per case:
makespan, rollouts completed / failed, tokens decoded (the survivors' plus what
the victim had decoded at the read that triggered its kill: a lower bound by at
most what it decoded in between) against tokens delivered (``usage``), and the
client's migrations (``client.statistics().migrations``, the counter behind
``trioforward_migrations_total``). A fresh engine replaces the killed one
before the next run.

    python bench/async_rl_staleness.py            # about 80 s on 2 idle cores
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
    import _rl_kill
    import _rollout_workload as rollout
    import _targets as targets
except ImportError:  # `python -m bench.async_rl_staleness`
    from bench import _rl_kill  # type: ignore[no-redef]
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


async def _run(
    mode: str, engines: list[str], work: rollout.Workload, args: Any, tag: str,
    kill: _rl_kill.Kill | None = None, knobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One async RL run (``kill``: an engine killed mid-step; ``knobs``: client
    settings); returns its measures."""
    from trioforward.dispatch import open_client
    from trioforward.errors import TrioforwardError

    # (rollout, start index, staleness, tokens delivered); None: the rollout failed
    finished: list[tuple[int, int, int | None, int] | None] = []
    failures: Counter[str] = Counter()
    retries: Counter[str] = Counter()  # (phase/reason) of the answers' retries
    attempts: Counter[int] = Counter()  # answers by upstream attempts
    ready = trio.Event()
    index = [0]  # the trainer's version index
    async with open_client(engines, engine_capacity=args.slots, health_interval=3600.0, **(knobs or {})) as client:
        if mode == "bounded":
            client.declare_staleness(tenant="default", step=args.step, eta=args.eta)
        outputs = [(g, o) for g in range(work.groups) for o in work.group_outputs[g]]
        start = time.perf_counter()
        consumed: list[int] = []  # off-policyness of each consumed rollout

        async def one(i: int, group: int, tokens: int) -> None:
            body = {"model": "sim-base", "prompt": f"{tag} " + work.group_prompts[group],
                    "max_tokens": tokens, "temperature": 1.0}
            sent = time.perf_counter()
            try:
                answer = await client.post("/v1/completions", json=body, group=f"{tag}-g{group}")
            except TrioforwardError as exc:
                failures[type(exc).__name__] += 1
                finished.append(None)
            else:
                # The version it started under: the trainer's index when it passed the gate.
                delivered = json.loads(answer.content)["usage"]["completion_tokens"]
                retries.update(f"{phase}/{reason}" for phase, reason in answer.retries)
                attempts[answer.attempts] += 1
                finished.append((i, started_at(sent + answer.admission_time), answer.staleness, delivered))
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
                consumed.extend(index[0] - b[1] for b in batch if b is not None)
                await trio.sleep(args.train_s)  # the training step
                if kill is not None and index[0] == kill.step:
                    with trio.move_on_after(10):  # the kill lands inside this step (at_s None: it never came)
                        await kill.done.wait()
                index[0] += 1
                if kill is not None and index[0] == kill.step:
                    kill.at_step.set()
                timeline.append((time.perf_counter(), index[0]))
                await client.resume(weight_version=f"{tag}-v{index[0]}")

        async with trio.open_nursery() as nursery:
            if kill is not None:
                if kill.step == 0:
                    kill.at_step.set()
                nursery.start_soon(kill.run, start)
            for i, (group, tokens) in enumerate(outputs):
                nursery.start_soon(one, i, group, tokens)
            await trainer()
            nursery.cancel_scope.cancel()  # the kill, if it never came
        makespan = time.perf_counter() - start
        migrations = sum(client.statistics().migrations.values())
    done = [f for f in finished if f is not None]
    hist = Counter(consumed)
    ordered = sorted(consumed) or [0]
    staleness = Counter(f[2] for f in done if f[2] is not None)
    return {
        "mode": mode,
        "makespan_s": makespan,
        "completed": len(done),
        "failed": dict(failures),
        "tokens_delivered": sum(f[3] for f in done),
        "migrations": migrations,
        "retries": dict(retries),
        "attempts": {str(k): attempts[k] for k in sorted(attempts)},
        "versions": index[0],
        "off_policy_histogram": {str(k): hist[k] for k in sorted(hist)},
        "off_policy_mean": statistics.fmean(consumed) if consumed else 0.0,
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
    kill = doc["kill"]
    if kill["cases"]:
        lines.append(f"an engine SIGKILLed {kill['after_tokens']} tokens into step {kill['step']} "
                     f"({kill['mode']}, whole answers assembled from streams):")
        lines += _rl_kill.table(kill["cases"])
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few seconds: 32 rollouts, one engine (two for the kill cases)")
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
    p.add_argument("--cases", choices=("all", "staleness", "kill"), default="all",
                   help="the staleness modes, the engine-kill cases, or both")
    p.add_argument("--kill-mode", choices=MODES, default="bounded", help="the kill cases' mode")
    p.add_argument("--kill-step", type=int, default=0, help="the step (version index) the kill lands in")
    p.add_argument("--kill-tokens", type=int, default=None,
                   help="tokens the victim decodes in that step before its SIGKILL "
                        "(default: half its share of a step's tokens)")
    p.add_argument("--output", type=Path, default=RESULTS / "async_rl_staleness.json")
    return p


# Outputs long enough that the kill case's victim is mid-stream at its kill.
QUICK = {"engines": 1, "groups": 4, "step": 8, "train_s": 0.05, "repeats": 1, "max_output": 256,
         "median_output": 64, "time_scale": 0.3}


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
    argv_of = lambda port: _engine_argv(port, args)  # noqa: E731
    mean_output = sum(sum(o) for o in work.group_outputs) / (work.groups * 8)
    kill_tokens = args.kill_tokens or int(0.5 * args.step * mean_output / max(2, args.engines))
    kill_rows: list[dict[str, Any]] = []
    try:
        engines = targets.start_engines(args.engines, procs, argv_of)
        for r in range(args.repeats if args.cases != "kill" else 0):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):  # alternated
                for url in engines:  # a cold prefix cache for every run
                    targets.post_json(url + "/reset_prefix_cache", {})
                row = trio.run(_run, mode, engines, work, args, f"r{r}{mode[0]}")
                row["repeat"] = r
                runs.append(row)
                print(f"  {mode} #{r}: {row['makespan_s']:.2f} s, off-policy max {row['off_policy_max']}",
                      flush=True)
        if args.cases != "staleness":
            if len(engines) < 2:  # a survivor to migrate to
                engines += targets.start_engines(2 - len(engines), procs, argv_of)

            async def one_run(mode: str, urls: list[str], tag: str, kill: Any, knobs: Any) -> dict[str, Any]:
                return await _run(mode, urls, work, args, tag, kill, knobs)

            def restart() -> tuple[str, Any]:
                (url,) = targets.start_engines(1, procs, argv_of)
                return url, procs.pop()

            kill_rows = _rl_kill.runs(one_run, engines, procs, restart, args, kill_tokens, args.repeats)
    finally:
        for proc in procs:
            targets.stop(proc)
    modes: dict[str, Any] = {}
    for mode in MODES if args.cases != "kill" else ():
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
            modes["bounded"]["makespan_s"] / modes["unbounded"]["makespan_s"], 3) if modes else None,
        "modes": modes,
        "kill": {"mode": args.kill_mode, "step": args.kill_step, "after_tokens": kill_tokens,
                 "cases": _rl_kill.summary(kill_rows) if kill_rows else {}, "runs": kill_rows},
        "workload": work.describe(),
        "runs": runs,
    }
    if not args.quick and args.cases == "all":
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(format_table(doc))
    return doc


if __name__ == "__main__":
    main()
