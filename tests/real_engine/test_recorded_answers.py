"""The live vLLM still answers the probes as tests/sim/vllm_0_32_fixtures/ records
(the answers the simulated engine is held to: tests/sim/test_vllm_contract.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_probes import FIXTURES, PROBES
from vllm_shapes import load_fixture, same_outline


@pytest.mark.parametrize("name", [p.name for p in PROBES])
def test_live_answer_matches_the_recorded_one(recorded: Path, name: str) -> None:
    live, committed = load_fixture(recorded, name), load_fixture(FIXTURES, name)
    assert same_outline(live, committed), (live, committed)
