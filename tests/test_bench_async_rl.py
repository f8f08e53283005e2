"""bench/async_rl_staleness.py runs a tiny async RL loop both ways and reports what it names."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import async_rl_staleness as bench  # noqa: E402


def test_quick_run_consumes_every_rollout_in_both_modes() -> None:
    doc = bench.main(["--quick", "--cases", "staleness"])
    assert doc["rollouts"] == 32 and set(doc["modes"]) == {"unbounded", "bounded"}
    for run in doc["runs"]:
        assert sum(run["off_policy_histogram"].values()) == 32  # every rollout consumed once
        assert run["versions"] == 32 // 8
        # Answers that ended before any version was recorded have no staleness.
        assert sum(run["answer_staleness_histogram"].values()) <= 32
    # Unbounded, all 32 start under version 0 and the last batch is consumed at index 3.
    (unbounded,) = [r for r in doc["runs"] if r["mode"] == "unbounded"]
    assert unbounded["off_policy_histogram"] == {"0": 8, "1": 8, "2": 8, "3": 8}
    assert "bounded" in bench.format_table(doc)


def test_killed_engine_loses_no_rollout_with_migration_and_some_without() -> None:
    # Two engines; the first is SIGKILLed once it has decoded 173 tokens of step 0
    # with generations running: long enough outputs that they are mid-stream then.
    doc = bench.main(["--quick", "--cases", "kill"])
    assert doc["modes"] == {} and doc["kill"]["step"] == 0
    runs = {r["case"]: r for r in doc["kill"]["runs"]}
    on, off = runs["kill_migrate"], runs["kill_no_migration"]
    for run in (on, off):
        assert run["kill"]["at_s"] is not None  # the kill happened, inside the run
    assert on["completed"] == 32 and on["failed"] == {} and on["migrations"] >= 1
    assert off["migrations"] == 0 and off["failed"].get("UpstreamBroken", 0) >= 1
    assert off["completed"] + off["failed"]["UpstreamBroken"] == 32
    # Every rollout consumed by the trainer, failed ones dropped from its batches.
    assert sum(off["off_policy_histogram"].values()) == off["completed"]
    assert "kill_no_migration" in bench.format_table(doc)
