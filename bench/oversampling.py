"""An over-sampling round: cancel the stragglers by group vs let them finish vs abort-all on the engines.

A trainer submits G groups x S samples (default 96 x 8) and needs K groups
(64); the samples' lengths are spread (32..max tokens, seeded), so groups
finish at different times. Beside it, an "eval" job, a tenant of its own
(as another job on the same gateway is), sends short requests (16 tokens) in
closed loops on the same engines the whole time: the same eval traffic in
every mode of a round (same seeds). Three ways to end the round once K groups
are back, plus the eval traffic alone, alternated round by round (order
rotated), medians over the rounds reported:

- ``group-abort``: the trainer aborts every group still open, one
  ``client.abort(group=...)`` each (what ``POST /admin/abort`` runs);
- ``wait``: no abort, the stragglers run to their end (a trainer without one);
- ``engine-abort-all``: ``POST /abort_requests`` with no ids on every engine
  (vLLM dev mode's abort of everything: what trainers do today), which ends
  the eval job's requests too;
- ``eval-alone``: no rollout at all, the eval traffic by itself (its
  window starts when the loops do): what "unaffected" is measured against.

Measured per round: ``to_idle_s``, from the K-th group back to no rollout
request left anywhere (engines idle of the round's work); ``eval_p50_ms`` /
``eval_p95_ms``, the latency of the eval requests *sent* in a fixed window
of ``--window`` seconds from the K-th group (the same window in every mode:
the abort acts in it; the round lasts until the window's requests are back),
and over the whole round; ``eval_aborted``, eval requests that came back
``finish_reason: "abort"`` (their work lost); ``wasted_tokens``, tokens the
engines decoded for groups beyond the K kept. The A/B: the eval window's p50
with the group abort over the same without it (``wait``) and over the eval
traffic alone, per round (same seeds) and as the ratio of the medians.
The embedded client (the gateway's dispatch core) in this process, 2
simulated engines of 64 slots, 2 ms a decode step, in processes of their own
(``--engines inline``: in this process).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _targets as targets  # noqa: E402

from trioforward import open_client  # noqa: E402
from trioforward.sim import open_engine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODES = ("group-abort", "wait", "engine-abort-all", "eval-alone")
TENANTS = "trainer:weight=1;eval:weight=1"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@asynccontextmanager
async def _engines(args: argparse.Namespace) -> AsyncIterator[tuple[list[str], Callable[[], int]]]:
    """Two simulated engines: their URLs and a function giving the tokens they
    decoded. ``--engines process`` (the default): ``trioforward sim-engine``
    processes, so the benchmark's trio thread runs only the client and the two
    jobs; ``inline``: in this process (the engines' work then shares the thread)."""
    if args.engines == "inline":
        async with open_engine(capacity=args.capacity, decode_ms_per_token=args.decode_ms) as e1, open_engine(
            capacity=args.capacity, decode_ms_per_token=args.decode_ms
        ) as e2:
            yield [e1.url, e2.url], lambda: e1.stats.tokens_decoded + e2.stats.tokens_decoded
        return
    procs: list[Any] = []
    try:
        urls = []
        for _ in range(2):
            port = targets.free_port("127.0.0.1")
            procs.append(targets.spawn([sys.executable, "-c", targets.CLI, "sim-engine", "--port", str(port),
                                        "--capacity", str(args.capacity), "--decode-ms-per-token", str(args.decode_ms)]))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            await trio.to_thread.run_sync(targets.wait_health, url, proc)
        yield urls, lambda: sum(int(targets.engine_stats(u)["tokens_decoded"]) for u in urls)
    finally:
        for proc in procs:
            targets.stop(proc)


async def _round(args: argparse.Namespace, mode: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    lengths = [[rng.randint(32, args.max_tokens) for _ in range(args.samples)] for _ in range(args.groups)]
    async with _engines(args) as (engines, tokens_decoded):
        async with open_client(
            engines=engines, engine_capacity=args.capacity, abort_grace=5.0,
            tenants=TENANTS,
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
                        group=f"g{g}", logprobs=False, tenant="trainer",
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
                        model="sim-base", prompt=[9, i, n], max_tokens=16, logprobs=False, seed=n,
                        tenant="eval",
                    )
                    eval_lat.append((t0, time.perf_counter() - t0))
                    if any(ch.finish_reason == "abort" for ch in c.choices):
                        eval_aborted += 1
                    n += 1

            lags: list[tuple[float, float]] = []  # (when, s late): the event loop's stalls

            async def heartbeat() -> None:
                while not stop_eval.is_set():
                    t0 = time.perf_counter()
                    await trio.sleep(0.005)
                    lags.append((t0, time.perf_counter() - t0 - 0.005))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(heartbeat)
                for i in range(args.eval_loops):
                    nursery.start_soon(eval_loop, i)
                t_start = time.perf_counter()
                if mode == "eval-alone":  # the window opens once the loops run, as in the others
                    await trio.sleep(args.window)
                    t_kth = time.perf_counter()
                    kth.set()
                    idle.set()
                for g in range(args.groups if mode != "eval-alone" else 0):
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
                        for url in engines:
                            await http.post(url + "/abort_requests", json={})
                await idle.wait()
                t_idle = time.perf_counter()
                # The eval window is the same length in every mode: wait for its end.
                await trio.sleep(max(0.0, t_kth + args.window - time.perf_counter()))
                stop_eval.set()
            window = [d * 1000 for (t0, d) in eval_lat if t_kth <= t0 <= t_kth + args.window]
            whole = [d * 1000 for (_, d) in eval_lat]
            decoded = tokens_decoded()
            kept_tokens = sum(sum(lengths[g]) for g in done_groups[: args.keep])
            return {
                "mode": mode,
                "to_idle_s": round(t_idle - t_kth, 4) if mode != "eval-alone" else None,
                "round_s": round(t_idle - t_start, 3),
                "eval_window_requests": len(window),
                "eval_p50_ms": _pct(window, 0.5),
                "eval_p95_ms": _pct(window, 0.95),
                "eval_round_p50_ms": _pct(whole, 0.5),
                "eval_requests": len(eval_lat),
                "eval_aborted": eval_aborted,
                # The longest the trio thread (the client, the jobs; inline: the
                # engines too) was busy elsewhere in the window: what any request
                # there waited on top.
                "loop_stall_max_ms": round(
                    1000 * max((lag for t0, lag in lags if t_kth <= t0 <= t_kth + args.window), default=0.0), 1
                ),
                "wasted_tokens": max(0, decoded - kept_tokens - 16 * len(eval_lat)) if mode != "eval-alone" else 0,
            }


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        k = r % len(MODES)
        order = MODES[k:] + MODES[:k]  # rotated round by round
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
                    "eval_aborted", "wasted_tokens", "loop_stall_max_ms"):
            values = [x[key] for x in mine if x[key] is not None]
            med[key] = round(statistics.median(values), 4) if values else None
        results.append(med)
    by = {x["mode"]: x for x in results}
    summary: dict[str, Any] = {}
    if by["wait"]["to_idle_s"]:
        summary["to_idle_group_abort_vs_wait"] = round(by["group-abort"]["to_idle_s"] / by["wait"]["to_idle_s"], 3)
    # The A/B of the eval traffic: the same requests (same seeds) in the same window.
    for other in ("wait", "eval-alone"):
        for q in ("p50", "p95"):
            key = f"eval_window_{q}_group_abort_vs_{other.replace('-', '_')}"
            field = f"eval_{q}_ms"
            if by["group-abort"][field] and by[other][field]:
                summary[key] = round(by["group-abort"][field] / by[other][field], 3)
            paired = []
            for r in range(args.rounds):
                a = [x for x in rows if x["round"] == r and x["mode"] == "group-abort"]
                b = [x for x in rows if x["round"] == r and x["mode"] == other]
                if a and b and a[0][field] and b[0][field]:
                    paired.append(round(a[0][field] / b[0][field], 3))
            summary[key + "_per_round"] = paired
    return {
        "benchmark": "oversampling",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "results": results,
        "rounds": rows,
        "summary": summary,
    }


def format_table(report: dict[str, Any]) -> str:
    lines = [
        "| mode | K-th group → idle s | eval p50 ms (window) | eval p95 ms (window) | eval p50 ms (round) | eval aborted | wasted tokens | loop stall max ms (window) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['mode']} | {r['to_idle_s']} | {r['eval_p50_ms']} | {r['eval_p95_ms']} | "
            f"{r['eval_round_p50_ms']} | {r['eval_aborted']} | {r['wasted_tokens']} | {r.get('loop_stall_max_ms')} |"
        )
    summary = report.get("summary", {})
    lines.append("")
    for other in ("wait", "eval_alone"):
        for q in ("p50", "p95"):
            key = f"eval_window_{q}_group_abort_vs_{other}"
            if key in summary:
                lines.append(
                    f"eval {q} in the window, group-abort / {other.replace('_', '-')}: {summary[key]}"
                    f" (per round: {summary.get(key + '_per_round')})"
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
    p.add_argument("--eval-loops", type=int, default=8)
    p.add_argument("--window", type=float, default=0.5, help="s: the eval window from the K-th group")
    p.add_argument("--engines", choices=("process", "inline"), default="process",
                   help="the simulated engines in processes of their own, or in this one")
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
