"""The engine-kill case of bench/async_rl_staleness.py: one sim SIGKILLed mid-step.

The victim (the first engine) is killed once it has decoded ``tokens`` tokens
since the trainer reached version index ``step``, with generations running (read from its ``GET
/sim/stats``, polled every 10 ms; SIGKILL sent right after the read that
crossed the threshold, so what it decoded before dying is that read plus at
most one decode step). The trainer's next weight update waits for the kill,
so the kill always lands inside step ``step``: the rollouts on the victim
then were made under the current version (step 0: before any update), the
only ones a migration may move (docs/operations.md, "Migration", "Same
weights"). Loopback only: the killed process is one this benchmark started.
"""

from __future__ import annotations

import functools
import os
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import trio

try:
    import _targets as targets
except ImportError:  # `python -m bench.async_rl_staleness`
    from bench import _targets as targets  # type: ignore[no-redef]

__all__ = ["Kill", "decoded"]


def decoded(engines: list[str]) -> dict[str, int]:
    """Each engine's ``tokens_decoded`` (``GET /sim/stats``)."""
    return {url: int(targets.engine_stats(url)["tokens_decoded"]) for url in engines}


@dataclass
class Kill:
    """Kills ``proc`` (engine ``url``) ``tokens`` decoded tokens into step ``step``."""

    url: str
    proc: subprocess.Popen[bytes]
    tokens: int
    step: int = 0
    at_step: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    decoded_before: int = 0  # its tokens_decoded at the last read before the kill
    at_s: float | None = None  # seconds into the run

    async def run(self, start: float) -> None:
        """Wait for step ``step``, then kill the engine at the token threshold."""
        await self.at_step.wait()
        base = int((await trio.to_thread.run_sync(targets.engine_stats, self.url))["tokens_decoded"])
        while True:  # a poll: the engine is another process
            if await trio.to_thread.run_sync(self._read_and_kill, base):
                break
            await trio.sleep(0.01)
        self.at_s = time.perf_counter() - start
        self.done.set()

    def _read_and_kill(self, base: int) -> bool:
        """One read of the victim's stats; past the threshold, SIGKILL at once (in
        this worker thread: the benchmark's busy event loop adds no delay)."""
        stats = targets.engine_stats(self.url)
        if int(stats["tokens_decoded"]) - base < self.tokens or stats["running"] == 0:
            return False
        os.kill(self.proc.pid, signal.SIGKILL)
        self.decoded_before = int(stats["tokens_decoded"])
        self.proc.wait()
        return True

    def describe(self) -> dict[str, Any]:
        return {"step": self.step, "after_tokens": self.tokens, "at_s": self.at_s,
                "victim_decoded_before_kill": self.decoded_before}


#: The two kill cases: the client knobs each runs with (whole answers assembled
#: from streams, so a whole answer broken off has tokens to migrate from).
CASES = {"kill_migrate": {"assemble_answers": True},
         "kill_no_migration": {"assemble_answers": True, "max_migrations": 0}}


def runs(
    run: Any, engines: list[str], procs: list[subprocess.Popen[bytes]], restart: Any,
    args: Any, tokens: int, repeats: int,
) -> list[dict[str, Any]]:
    """``repeats`` x both :data:`CASES`, alternated; ``run(mode, engines, tag, kill,
    knobs)`` is one async RL run, ``restart()`` a fresh engine's URL (it replaces
    the killed one, ``engines[0]``, whose process is ``procs[0]``)."""
    rows: list[dict[str, Any]] = []
    names = list(CASES)
    for r in range(repeats):
        for case in (names if r % 2 == 0 else names[::-1]):
            for url in engines:
                targets.post_json(url + "/reset_prefix_cache", {})
            before = decoded(engines)
            kill = Kill(engines[0], procs[0], tokens, args.kill_step)
            row = trio.run(run, args.kill_mode, list(engines), f"r{r}{case}", kill, CASES[case])
            after = decoded(engines[1:])
            row["case"], row["repeat"], row["kill"] = case, r, kill.describe()
            row["tokens_decoded"] = (kill.decoded_before - before[engines[0]]
                                     + sum(after[u] - before[u] for u in engines[1:]))
            row["decoded_over_delivered"] = row["tokens_decoded"] / max(1, row["tokens_delivered"])
            rows.append(row)
            print(f"  {case} #{r}: {row['makespan_s']:.2f} s, {row['completed']} completed, "
                  f"failed {row['failed']}, {row['migrations']} migrations", flush=True)
            procs.pop(0)
            engines.pop(0)
            url, proc = restart()
            engines.append(url)
            procs.append(proc)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case: medians over repeats of makespan, completed, failed, tokens, migrations."""
    out: dict[str, Any] = {}
    for case in CASES:
        med = functools.partial(_median, [r for r in rows if r["case"] == case])
        out[case] = {
            "makespan_s": round(med(lambda r: r["makespan_s"]), 3),
            "completed": med(lambda r: r["completed"]),
            "failed": med(lambda r: sum(r["failed"].values())),
            "tokens_decoded": med(lambda r: r["tokens_decoded"]),
            "tokens_delivered": med(lambda r: r["tokens_delivered"]),
            "decoded_over_delivered": round(med(lambda r: r["decoded_over_delivered"]), 3),
            "migrations": med(lambda r: r["migrations"]),
            "kill_at_s": round(med(lambda r: r["kill"]["at_s"] or 0.0), 2),
        }
    return out


def _median(rows: list[dict[str, Any]], key: Any) -> float:
    return float(statistics.median(key(r) for r in rows))


def table(kills: dict[str, Any]) -> list[str]:
    lines = [f"{'case':<18} {'makespan s':>10} {'done':>5} {'failed':>6} {'decoded':>8} "
             f"{'delivered':>9} {'ratio':>6} {'migrations':>10} {'kill at s':>9}"]
    for case, k in kills.items():
        lines.append(f"{case:<18} {k['makespan_s']:>10.2f} {k['completed']:>5.0f} {k['failed']:>6.0f} "
                     f"{k['tokens_decoded']:>8.0f} {k['tokens_delivered']:>9.0f} "
                     f"{k['decoded_over_delivered']:>6.3f} {k['migrations']:>10.0f} {k['kill_at_s']:>9.2f}")
    return lines
