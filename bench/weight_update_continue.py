"""Weight updates during a rollout batch: continue vs whole replay vs keep, side by side.

A batch of long generations (default 512 requests x 512 tokens) runs through the
embedded client (``trioforward.open_client``) on simulated engines (default 4
engines x 64 slots, 4 ms per decode step) while 1-3 weight updates land at
random points (the same points for every mode of a round): ``pause`` ->
0.1 s of weight push -> ``resume(weight_version=...)``. Modes: ``continue``
(``engine_mode="abort", replay="continue"``), ``whole`` (``replay=True``) and
``keep`` (``engine_mode="keep"``). Reported per mode (median of the rounds, the
modes alternated within each round): engine tokens decoded per token delivered
(the sims' ``tokens_decoded``), makespan, makespan / keep's, and the floor:
tokens needed / decode throughput (engines x slots / decode time per step),
plus the time the engines were paused.

Run: ``python bench/weight_update_continue.py [--requests 512] [--tokens 512]
[--engines 4] [--slots 64] [--decode-ms 4] [--rounds 3]``. Writes
``bench/results/weight_update_continue.json``; ``main(argv)`` returns it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

import trioforward
from trioforward.errors import TrioforwardError
from trioforward.sim import open_engine

RESULTS = Path(__file__).parent / "results" / "weight_update_continue.json"
MODES = {
    "continue": {"engine_mode": "abort", "replay": "continue"},
    "whole": {"engine_mode": "abort", "replay": True},
    "keep": {"engine_mode": "keep"},
}
PUSH_SECONDS = 0.1


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--tokens", type=int, default=512, help="max_tokens of each request")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--slots", type=int, default=64, help="capacity per engine")
    p.add_argument("--decode-ms", type=float, default=4.0, help="decode time per step (ms)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--output", type=Path, default=RESULTS)
    return p.parse_args(argv)


async def _batch(args: argparse.Namespace, mode: str, updates: list[float]) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(
                open_engine(capacity=args.slots, decode_ms_per_token=args.decode_ms)
            )
            for _ in range(args.engines)
        ]
        client = await stack.enter_async_context(
            trioforward.open_client(
                engines=[e.url for e in engines],
                engine_capacity=args.slots,
                health_interval=3600.0,
                engine_kind="vllm",
            )
        )
        await client.resume(weight_version="step-0")
        delivered = 0
        failures = 0
        paused = 0.0

        async def one(i: int) -> None:
            nonlocal delivered, failures
            body = {"model": "sim-base", "prompt": [1 + i % 97, 2, 3, 4], "max_tokens": args.tokens, "seed": i}
            try:
                reply = await client.post("/v1/completions", json=body)
                delivered += reply.json()["usage"]["completion_tokens"]
            except TrioforwardError as exc:
                failures += 1
                if failures == 1:
                    print(f"{mode}: first failure: {exc!r}", flush=True)

        async def update_at(at: float, step: int) -> None:
            nonlocal paused
            await trio.sleep_until(start + at)
            t = trio.current_time()
            await client.pause(**MODES[mode])  # type: ignore[arg-type]
            await trio.sleep(PUSH_SECONDS)
            await client.resume(weight_version=f"step-{step}")
            paused += trio.current_time() - t

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for i in range(args.requests):
                nursery.start_soon(one, i)
            async with trio.open_nursery() as updaters:
                for step, at in enumerate(updates, 1):
                    updaters.start_soon(update_at, at, step)
        makespan = trio.current_time() - start
        decoded = sum(e.stats.tokens_decoded for e in engines)
        return {
            "mode": mode,
            "makespan_s": makespan,
            "tokens_decoded": decoded,
            "tokens_delivered": delivered,
            "decoded_per_delivered": decoded / max(delivered, 1),
            "paused_s": paused,
            "failures": failures,
            "continued": client.continued.answers,
        }


def _summary(rounds: list[list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    needed = args.requests * args.tokens
    floor = needed / (args.engines * args.slots / (args.decode_ms / 1000.0))
    rows = []
    keep = statistics.median(r["makespan_s"] for rnd in rounds for r in rnd if r["mode"] == "keep")
    for mode in MODES:
        runs = [r for rnd in rounds for r in rnd if r["mode"] == mode]
        makespan = statistics.median(r["makespan_s"] for r in runs)
        rows.append(
            {
                "mode": mode,
                "decoded_per_delivered": round(statistics.median(r["decoded_per_delivered"] for r in runs), 4),
                "makespan_s": round(makespan, 3),
                "vs_keep": round(makespan / keep, 3),
                "floor_s": round(floor, 3),
                "paused_s": round(statistics.median(r["paused_s"] for r in runs), 3),
                "failures": sum(r["failures"] for r in runs),
                "continued_answers": statistics.median(r["continued"] for r in runs),
            }
        )
    return {"tokens_needed": needed, "floor_s": floor, "results": rows}


def format_table(document: dict[str, Any]) -> str:
    """The per-mode table of docs/performance.md."""
    lines = [
        "| mode | tokens decoded / delivered | makespan (s) | vs keep | floor (s) | paused (s) | answers continued | failures |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in document["results"]:
        lines.append(
            f"| {r['mode']} | {r['decoded_per_delivered']:.3f} | {r['makespan_s']:.2f} | {r['vs_keep']:.3f}"
            f" | {r['floor_s']:.2f} | {r['paused_s']:.2f} | {r['continued_answers']:g} | {r['failures']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    rng = random.Random(args.seed)
    needed = args.requests * args.tokens
    floor = needed / (args.engines * args.slots / (args.decode_ms / 1000.0))
    rounds: list[list[dict[str, Any]]] = []
    started = time.perf_counter()
    for n in range(args.rounds):
        updates = sorted(rng.uniform(0.1, 0.9) * floor for _ in range(rng.randint(1, 3)))
        order = list(MODES)
        order = order[n % 3 :] + order[: n % 3]  # alternate which mode goes first
        results = [trio.run(_batch, args, mode, updates) for mode in order]
        for r in results:
            r["updates_at_s"] = [round(u, 3) for u in updates]
        rounds.append(results)
        print(f"round {n + 1}: " + ", ".join(f"{r['mode']} {r['makespan_s']:.2f} s" for r in results), flush=True)
    document = {
        "benchmark": "weight_update_continue",
        "params": {k: v for k, v in vars(args).items() if k != "output"},
        **_summary(rounds, args),
        "rounds": rounds,
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(format_table(document))
    return document


if __name__ == "__main__":
    main()
