"""bench/rollout_makespan.py runs one tiny RL step through trioforward and reports
what it names; its workload and lower bound follow from the seed and the model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _rollout_workload as rollout  # noqa: E402
from bench import rollout_makespan as bench  # noqa: E402


def test_workload_is_seeded_and_sessions_extend_their_last_prompt() -> None:
    a = rollout.draw(7, groups=3, samples=4, sessions=2, turns=3, max_output=500)
    assert a.describe() == rollout.draw(7, groups=3, samples=4, sessions=2, turns=3, max_output=500).describe()
    assert a.describe() != rollout.draw(8, groups=3, samples=4, sessions=2, turns=3, max_output=500).describe()
    assert a.requests == 3 * 4 + 2 * 3
    assert all(1 <= o <= 500 for row in a.group_outputs + a.session_outputs for o in row)
    for t in range(1, 3):
        previous, prompt = a.session_prompt(1, t - 1), a.session_prompt(1, t)
        assert prompt.startswith(previous)
        assert len(prompt) == len(previous) + a.session_outputs[1][t - 1] + a.session_tool[1][t - 1]


def test_lower_bound_is_the_larger_of_work_and_longest_chain() -> None:
    work = rollout.draw(1, groups=1, samples=1, sessions=0, turns=0, system_tokens=10)
    timing = rollout.FlatTiming(prefill_ms=1.0, decode_ms=10.0, slots=1)
    prompt, output = len(work.group_prompts[0]), work.group_outputs[0][0]
    alone = (prompt * 1.0 + output * 10.0) / 1e3
    bound = rollout.lower_bound(work, timing, engines=1)
    # one request on one slot: both bounds are that request alone
    assert bound["chain_s"] == pytest.approx(alone) and bound["work_s"] == pytest.approx(alone)
    # two engines: the work splits (the system prompt computed on each), the chain does not
    two = rollout.lower_bound(work, timing, engines=2)
    assert two["work_s"] == pytest.approx((alone + 10 * 1.0 / 1e3) / 2)
    assert two["lower_bound_s"] == two["chain_s"] == bound["chain_s"]


def test_model_bound_adds_up_the_engine_models_step_costs() -> None:
    from trioforward.sim.physics._physics import EngineProfile

    profile = EngineProfile("t", step_s=1.0, seq_s=0.1, kv_token_s=0.001, prefill_token_s=0.01,
                            max_num_batched_tokens=100)
    work = rollout.draw(3, groups=1, samples=1, sessions=0, turns=0, system_tokens=10)
    prompt, output = len(work.group_prompts[0]), work.group_outputs[0][0]
    # alone: the prompt in chunks of 100 (one step each), then a token a step,
    # each reading the prompt and the tokens before it
    chunks = -(-prompt // 100)
    alone = (chunks * 1.0 + prompt * 0.01 + (output - 1) * 1.1
             + 0.001 * ((output - 1) * prompt + output * (output - 1) // 2))
    bound = rollout.model_lower_bound(work, profile, engines=1, max_num_seqs=8, kv_cache_tokens=0)
    assert bound["chain_s"] == pytest.approx(alone)
    # a KV budget smaller than the context a token reads forces more steps
    tight = rollout.model_lower_bound(work, profile, engines=1, max_num_seqs=8, kv_cache_tokens=prompt // 2)
    assert tight["work_s"] > bound["work_s"]
    assert rollout.model_lower_bound(work, profile, 1, 8, 0, time_scale=0.5)["chain_s"] == pytest.approx(alone / 2)


def test_tiny_run_through_trioforward_writes_every_measure(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    doc = bench.main(
        ["--systems", "trioforward:least-outstanding,trioforward:prefix", "--engines", "2", "--slots", "4",
         "--groups", "2", "--samples", "3", "--sessions", "2", "--turns", "2", "--median-output", "16",
         "--max-output", "64", "--kv-cache-tokens", "2048", "--time-scale", "0.05", "--repeats", "2",
         "--output", str(out)]
    )
    assert json.loads(out.read_text())["systems"] == doc["systems"]
    assert doc["lower_bound_s"] > 0 and doc["workload"]["requests"] == 2 * 3 + 2 * 2
    assert set(doc["systems"]) == {"trioforward:least-outstanding", "trioforward:prefix"}
    for system in doc["systems"].values():
        assert system["requests"] == 10 and system["errors"] == 0
        assert {"makespan_s", "tokens_per_s", "preemptions", "p50_ms", "p99_ms", "prefix_hit_rate",
                "busy_fraction", "vs_lower_bound"} <= set(system)
        assert len(system["makespans_s"]) == 2
        assert system["preemptions"] is not None  # read from every engine's /metrics
        assert 0 < system["model_share"]  # the engines' modelled step time came back
    # every run: each request reached an engine once, and every output token came back
    assert len(doc["runs"]) == 4 and {r["repeat"] for r in doc["runs"]} == {0, 1}
    for run in doc["runs"]:
        assert sum(run["requests_per_engine"]) == 10 and isinstance(run["preemptions"], int)
        assert run["output_tokens"] == doc["workload"]["output_tokens"]
    assert "| trioforward:prefix |" in bench.format_table(doc)


def test_model_bound_counts_only_unshared_kv_against_the_budget() -> None:
    # a group's samples share their prompt in the prefix cache: only what each
    # generates is its own, so only that bounds the steps a KV budget forces
    from trioforward.sim.physics._physics import EngineProfile

    profile = EngineProfile("t", step_s=1.0, seq_s=0.0, kv_token_s=0.0, prefill_token_s=0.0)
    work = rollout.draw(5, groups=1, samples=4, sessions=0, turns=0, system_tokens=10)
    own = sum(o * (o - 1) // 2 for o in work.group_outputs[0])
    bound = rollout.model_lower_bound(work, profile, engines=1, max_num_seqs=10**6, kv_cache_tokens=64)
    assert bound["work_s"] == pytest.approx(own / 64)
