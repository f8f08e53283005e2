"""An over-sampling round: cancel the stragglers by group vs let them finish vs abort-all on the engines.

A trainer submits G groups x S samples (default 96 x 8) and needs K groups
(64); the samples' lengths are spread (32..max tokens, seeded), so groups
finish at different times. Beside it, an "eval" job sends short requests
(16 tokens) in a few closed loops on the same engines the whole time. Three
ways to end the round once K groups are back, alternated round by round
(order rotated), medians over the rounds reported:

- ``group-abort``: the trainer aborts every group still open, one
  ``client.abort(group=...)`` each (what ``POST /admin/abort`` runs);
- ``wait``: no abort, the stragglers run to their end (a trainer without one);
- ``engine-abort-all``: ``POST /abort_requests`` with no ids on every engine
  (vLLM dev mode's abort of everything: what trainers do today), which ends
  the eval job's requests too.

Measured per round: ``to_idle_s``, from the K-th group back to no rollout
request left anywhere (engines idle of the round's work); ``eval_p50_ms`` /
``eval_p95_ms``, the eval requests' latency from the K-th group to idle (the
window the abort acts in), and over the whole round; ``eval_aborted``, eval
requests that came back ``finish_reason: "abort"`` (their work lost);
``wasted_tokens``, tokens the engines decoded for groups beyond the K kept.
In process: simulated engines (``trioforward.sim``, 2 ms a decode step) and
the embedded client (the gateway's dispatch core), 2 engines of 64 slots.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import trio

from trioforward import open_client
from trioforward.sim import open_engine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODES = ("group-abort", "wait", "engine-abort-all")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _round(args: argparse.Namespace, mode: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    lengths = [[rng.randint(32, args.max_tokens) for _ in range(args.samples)] for _ in range(args.groups)]
    async with open_engine(capacity=args.capacity, decode_ms_per_token=args.decode_ms) as e1, open_engine(
        capacity=args.capacity, decode_ms_per_token=args.decode_ms
    ) as e2:
        engines = (e1, e2)
        async with open_client(
            engines=[e.url for e in engines], engine_capacity=args.capacity, abort_grace=5.0
        ) as client:
            done_groups: list[int] = []
            kth = trio.Event()
            left = [args.samples] * args.groups
            open_requests = 0
            idle = trio.Event()
            eval_lat: list[tuple[float, float]] = []  # (start, seconds)
            eval_aborted = 0
            stop_eval = trio.Event()
            t_kth = 0.0

            async def sample(g: int, s: int) -> None:
                nonlocal open_requests, t_kth
                try:
                    await client.complete(
                        model="sim-base", prompt=[g, s, 1], max_tokens=lengths[g][s], seed=seed * 1000 + g,
                        group=f"g{g}", logprobs=False,
                    )
                finally:
                    open_requests -= 1
                    left[g] -= 1
                    if left[g] == 0:
                        done_groups.append(g)
                        if len(done_groups) == args.keep:
                            t_kth = time.perf_counter()
                            kth.set()
                    if open_requests == 0:
                        idle.set()

            async def eval_loop(i: int) -> None:
                nonlocal eval_aborted
                n = 0
                while not stop_eval.is_set():
                    t0 = time.perf_counter()
                    c = await client.complete(
                        model="sim-base", prompt=[9, i, n], max_tokens=16, logprobs=False, seed=n
                    )
                    eval_lat.append((t0, time.perf_counter() - t0))
                    if any(ch.finish_reason == "abort" for ch in c.choices):
                        eval_aborted += 1
                    n += 1

            async with trio.open_nursery() as nursery:
                for i in range(args.eval_loops):
                    nursery.start_soon(eval_loop, i)
                t_start = time.perf_counter()
                for g in range(args.groups):
                    for s in range(args.samples):
                        open_requests += 1
                        nursery.start_soon(sample, g, s)
                await kth.wait()
                if mode == "group-abort":
                    kept = set(done_groups)
                    async with trio.open_nursery() as calls:
                        for g in range(args.groups):
                            if g not in kept and left[g]:
                                calls.start_soon(lambda g=g: client.abort(group=f"g{g}"))
                elif mode == "engine-abort-all":
                    import httpx

                    async with httpx.AsyncClient() as http:
                        for e in engines:
                            await http.post(e.url + "/abort_requests", json={})
                await idle.wait()
                t_idle = time.perf_counter()
                stop_eval.set()
            window = [d * 1000 for (t0, d) in eval_lat if t_kth <= t0 <= t_idle]
            whole = [d * 1000 for (_, d) in eval_lat]
            decoded = sum(e.stats.tokens_decoded for e in engines)
            kept_tokens = sum(sum(lengths[g]) for g in done_groups[: args.keep])
            return {
                "mode": mode,
                "to_idle_s": round(t_idle - t_kth, 4),
                "round_s": round(t_idle - t_start, 3),
                "eval_p50_ms": _pct(window, 0.5),
                "eval_p95_ms": _pct(window, 0.95),
                "eval_round_p50_ms": _pct(whole, 0.5),
                "eval_requests": len(eval_lat),
                "eval_aborted": eval_aborted,
                "wasted_tokens": max(0, decoded - kept_tokens - 16 * len(eval_lat)),
            }


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = MODES[r % 3 :] + MODES[: r % 3]  # A/B/C rotated
        for mode in order:
            row = trio.run(_round, args, mode, 1 + r)
            row["round"] = r
            rows.append(row)
            print(json.dumps(row), flush=True)
    results = []
    for mode in MODES:
        mine = [x for x in rows if x["mode"] == mode]
        med: dict[str, Any] = {"mode": mode}
        for key in ("to_idle_s", "round_s", "eval_p50_ms", "eval_p95_ms", "eval_round_p50_ms",
                    "eval_aborted", "wasted_tokens"):
            values = [x[key] for x in mine if x[key] is not None]
            med[key] = round(statistics.median(values), 4) if values else None
        results.append(med)
    by = {x["mode"]: x for x in results}
    summary = {}
    if by["wait"]["to_idle_s"]:
        summary["to_idle_group_abort_vs_wait"] = round(by["group-abort"]["to_idle_s"] / by["wait"]["to_idle_s"], 3)
    return {
        "benchmark": "oversampling",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "results": results,
        "rounds": rows,
        "summary": summary,
    }


def format_table(report: dict[str, Any]) -> str:
    lines = [
        "| mode | K-th group → idle s | eval p50 ms (window) | eval p95 ms (window) | eval p50 ms (round) | eval aborted | wasted tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['mode']} | {r['to_idle_s']} | {r['eval_p50_ms']} | {r['eval_p95_ms']} | "
            f"{r['eval_round_p50_ms']} | {r['eval_aborted']} | {r['wasted_tokens']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description="An over-sampling round: group abort vs wait vs abort-all.")
    p.add_argument("--groups", type=int, default=96)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--keep", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--capacity", type=int, default=64, help="slots per engine")
    p.add_argument("--decode-ms", type=float, default=2.0)
    p.add_argument("--eval-loops", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "oversampling.json"))
    args = p.parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(format_table(report))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
