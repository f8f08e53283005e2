"""bench/weight_update_continue.py runs at a tiny size and reports what it names."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import weight_update_continue as bench  # noqa: E402


def test_tiny_run_compares_the_three_modes(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    doc = bench.main(
        ["--requests", "24", "--tokens", "24", "--engines", "2", "--slots", "6",
         "--decode-ms", "5", "--rounds", "1", "--output", str(out)]
    )
    assert out.exists() and doc["tokens_needed"] == 24 * 24
    rows = {r["mode"]: r for r in doc["results"]}
    assert set(rows) == {"continue", "whole", "keep"}
    assert all(r["failures"] == 0 for r in rows.values())
    for runs in doc["rounds"]:
        for r in runs:
            assert r["tokens_delivered"] == 24 * 24  # every answer whole, in every mode
    # keep and continue decode each token once; whole at least that
    assert rows["keep"]["decoded_per_delivered"] == 1.0
    assert rows["continue"]["decoded_per_delivered"] <= rows["whole"]["decoded_per_delivered"]
    assert "| continue |" in bench.format_table(doc)
