"""The engine model's step cost (trioforward/sim/physics/_physics.py): monotone, and the profiles' factors."""

from __future__ import annotations

import pytest

from trioforward.sim.physics._physics import PROFILES, EngineProfile, step_seconds


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_step_time_is_monotone_in_batch_kv_and_prefill(name: str) -> None:
    p = PROFILES[name]
    assert p.name == name and p.source
    batches = [p.step_seconds(b, 128 * b, 0) for b in (1, 2, 8, 32, 64)]
    assert batches == sorted(batches) and batches[0] < batches[-1]
    kvs = [p.step_seconds(8, kv, 0) for kv in (0, 1_000, 10_000, 100_000)]
    assert kvs == sorted(kvs) and kvs[0] < kvs[-1]
    prefills = [p.step_seconds(8, 1_000, n) for n in (0, 16, 512, 2048)]
    assert prefills == sorted(prefills) and prefills[0] < prefills[-1]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_64_running_decode_each_token_slower_than_1_by_the_profiles_factor(name: str) -> None:
    p = PROFILES[name]
    one = p.step_seconds(1, 256, 0)
    sixty_four = p.step_seconds(64, 64 * 256, 0)
    factor = (p.step_s + 64 * p.seq_s + 64 * 256 * p.kv_token_s) / (p.step_s + p.seq_s + 256 * p.kv_token_s)
    assert sixty_four / one == pytest.approx(factor)
    assert p.decode_factor(64, 256) == pytest.approx(factor)
    assert factor > 1.05  # measurably slower per token, yet far cheaper than 64 steps
    assert sixty_four < 64 * one


def test_an_empty_step_costs_nothing_and_the_function_form_agrees() -> None:
    p = PROFILES["vllm-cpu-tiny"]
    assert p.step_seconds(0, 0, 0) == 0.0
    assert step_seconds(p, 3, 300, 10) == p.step_seconds(3, 300, 10)


def test_a_profile_refuses_negative_coefficients_and_empty_blocks() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        EngineProfile("bad", step_s=-1.0, seq_s=0.0, kv_token_s=0.0, prefill_token_s=0.0)
    with pytest.raises(ValueError, match="block_size"):
        EngineProfile("bad", step_s=0.0, seq_s=0.0, kv_token_s=0.0, prefill_token_s=0.0, block_size=0)


def test_alone_seconds_is_what_the_scheduler_takes_for_one_sequence() -> None:
    from types import SimpleNamespace

    import trio

    from trioforward.sim.core._stats import EngineStats
    from trioforward.sim.physics._scheduler import Scheduler

    p = EngineProfile("p", 0.01, 0.001, 1e-6, 1e-5, max_num_batched_tokens=256)
    s = Scheduler(
        p, stats=EngineStats(), rl=SimpleNamespace(frozen=False), cache=None,  # type: ignore[arg-type]
        max_num_seqs=0, kv_cache_tokens=0, time_scale=1.0, stall=lambda: (1.0, 0.0), changed=trio.Event,
    )  # fmt: skip
    s.submit("m", [list(range(600))], [[1] * 50])
    total = 0.0
    while s.running or s.waiting:
        seconds, plan = s._schedule()
        s._advance(plan)
        total += seconds
    assert total == pytest.approx(p.alone_seconds(600, 50))
    assert p.decode_tokens_per_second(64, 100) > p.decode_tokens_per_second(1, 100)
