"""bench/async_rl_staleness.py runs a tiny async RL loop both ways and reports what it names."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import async_rl_staleness as bench  # noqa: E402


def test_quick_run_consumes_every_rollout_in_both_modes() -> None:
    doc = bench.main(["--quick"])
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
