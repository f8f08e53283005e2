"""bench/run_all.py writes docs/performance.md from the JSON results, in a fixed layout,
keeping hand-written notes across regenerations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import run_all  # noqa: E402


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    monkeypatch.setattr(run_all, "DOC", tmp_path / "performance.md")
    monkeypatch.setattr(run_all, "MACHINE", tmp_path / "machine.json")
    (tmp_path / "machine.json").write_text(json.dumps({**run_all.describe_machine(), "runs": {
        "gateway_burst": {"seconds": 12.0, "argv": ["--sizes", "64"], "error": None}}}))
    return tmp_path


def test_generic_table_flattens_rows_and_nested_results() -> None:
    table = run_all.generic_table({"results": [{"target": "a", "size": 64, "p50_ms": 1.23456}]})
    assert table.splitlines() == ["| target | size | p50_ms |", "|---|---|---|", "| a | 64 | 1.23 |"]
    nested = run_all.generic_table({"results": {"httpx": {"512": {"cpu_us": 80.0}}}})
    assert "| httpx | 512 | 80 |" in nested


def test_page_has_a_section_per_benchmark_and_keeps_notes(results: Path) -> None:
    (results / "gateway_burst.json").write_text(json.dumps(
        {"benchmark": "gateway_burst", "results": [{"target": "trioforward", "size": 64, "errors": 0}],
         "cpu_flatness": {"trioforward": 1.1}}))
    page = run_all.render()
    for bench in run_all.BENCHMARKS:
        assert f"## {bench.title}" in page
    assert "## Machine" in page and "cores" in page
    assert "took 12 s" in page and "trioforward: 1.1" in page
    assert "Results of a standalone run of `bench/pool_cpu.py`" in page
    assert "_No results yet" in page  # the benchmarks without JSON say so
    edited = page.replace("<!-- notes:gateway_burst -->\n", "<!-- notes:gateway_burst -->\nBecause.\n")
    run_all.DOC.write_text(edited)
    assert "<!-- notes:gateway_burst -->\nBecause.\n<!-- /notes:gateway_burst -->" in run_all.render()
