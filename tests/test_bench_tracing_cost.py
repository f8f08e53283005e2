"""bench/tracing_cost.py's report: medians over rounds and the ratios to `before`
and `off` (the figures docs/performance.md shows)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import tracing_cost  # noqa: E402


def test_medians_over_rounds_and_ratios_to_before_and_off() -> None:
    cpu = {"before": [100, 300, 200], "off": [210, 190, 400], "on-1": [400, 420, 380], "on-0.1": [250, 240, 260]}
    rows = [
        {"target": name, "size": 64, "round": r, "cpu_per_request_us": float(v), "p50_ms": 1.0,
         "throughput_rps": 10.0, "errors": 0}
        for name, values in cpu.items() for r, v in enumerate(values)
    ]
    report = {"sizes": [64], "rounds": 3, "before": "abc1234", "results": rows}
    medians = {row["target"]: row for row in tracing_cost._medians(report)}
    assert medians["before"]["cpu_per_request_us"] == 200 and medians["off"]["cpu_per_request_us"] == 210
    assert medians["on-1"]["vs_before"] == 2.0 and medians["on-1"]["vs_off"] == 400 / 210
    assert medians["off"]["cpu_us_each_round"] == [210, 190, 400]
    report["medians"] = list(medians.values())
    table = tracing_cost.format_table(report)
    assert "| on-0.1 | 64 | 250 | 250, 240, 260 | 1.25 |" in table
    assert "abc1234" in table
