"""Capacity from the engine: the load-report parsers, the adaptation rule and the
polling loop with reports that vanish, lie or go stale (docs/dispatch.md,
"Capacity from the engine")."""

from __future__ import annotations

import logging
import math

import pytest
import trio
import trio.testing

from trioforward.dispatch.engines import _adaptive
from trioforward.dispatch.engines._adaptive import START, AdaptiveLimit, load_loop
from trioforward.dispatch.engines._engines import Engine
from trioforward.dispatch.engines._load import LoadReport, parse_sglang_load, parse_vllm_metrics

SAMPLE = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.25
vllm:num_preemptions_total{engine="0",model_name="tiny"} 89.0
vllm:num_preemptions_created{engine="0",model_name="tiny"} 1.7961659937036686e+09
"""


def test_vllm_metrics_are_summed_over_ranks() -> None:
    report = parse_vllm_metrics(SAMPLE)
    assert report == LoadReport(running=5, waiting=1, kv_usage=0.375, preemptions=89.0)
    assert report.busy == 6


def test_the_recorded_vllm_sample_parses() -> None:
    from pathlib import Path

    text = (Path(__file__).parents[2] / "bench" / "results" / "vllm_metrics_sample.txt").read_bytes()
    assert parse_vllm_metrics(text) == LoadReport(0, 0, 0.0, 89.0)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html>500</html>",
        b"vllm:num_requests_running 1\n",  # no waiting
        b"vllm:num_requests_running -1\nvllm:num_requests_waiting 0\n",
        b"vllm:num_requests_running nan\nvllm:num_requests_waiting 0\n",
        b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 7.0\n",
        b"vllm:num_requests_running one\nvllm:num_requests_waiting 0\n",
    ],
)
def test_garbage_vllm_metrics_are_no_report(body: bytes) -> None:
    assert parse_vllm_metrics(body) is None


def test_sglang_load() -> None:
    body = b'[{"dp_rank":0,"num_reqs":5,"num_waiting_reqs":2,"num_tokens":1000,"num_pending_tokens":250,"ts_tic":1.0}]'
    assert parse_sglang_load(body) == LoadReport(3, 2, 0.75, None)
    for bad in (b"{", b"[]", b'[{"num_reqs": 1}]', b'[{"num_reqs": "x", "num_waiting_reqs": 0}]', b"[1]"):
        assert parse_sglang_load(bad) is None


def _report(running: int, waiting: int = 0, usage: float | None = 0.1, preempted: float = 0.0) -> LoadReport:
    return LoadReport(running, waiting, usage, preempted)


def test_grows_while_the_limit_binds_and_never_past_the_bound() -> None:
    control = AdaptiveLimit(64)
    assert control.limit == START
    seen = [control.observe(_report(control.limit), binding=True) for _ in range(12)]
    assert seen[:3] == [16, 32, 64]  # slow start doubles
    assert max(seen) == 64  # the bound (engine_capacity)
    # Not binding: no growth.
    control = AdaptiveLimit(64)
    assert control.observe(_report(2), binding=False) == START


def test_growth_holds_at_kv_high() -> None:
    control = AdaptiveLimit(256)
    assert control.observe(_report(8, usage=0.5), binding=True) == 16
    assert control.observe(_report(16, usage=0.96), binding=True) == 16  # at KV_HIGH: hold
    assert control.observe(_report(16, usage=0.9), binding=True) == 32


def test_preemptions_cut_within_one_report() -> None:
    control = AdaptiveLimit(64)
    for _ in range(3):
        control.observe(_report(control.limit, preempted=5), binding=True)
    assert control.limit == 64
    assert control.observe(_report(40, preempted=6), binding=True) == 45  # what runs + slack 5
    assert control.saturated and not control.slow_start
    assert control.observe(_report(40, preempted=6), binding=True) == 46  # additive from here
    # A counter that went back (the engine restarted) is no preemption.
    assert control.observe(_report(31, preempted=0), binding=False) == 46


def test_waiting_cuts_to_what_runs_within_two_reports() -> None:
    control = AdaptiveLimit(64)
    for _ in range(3):
        control.observe(_report(control.limit), binding=True)
    assert control.observe(_report(20, waiting=10), binding=True) == 64  # one report: noise
    assert control.observe(_report(20, waiting=10), binding=True) == 23  # runs 20, slack 3
    assert control.saturated
    for _ in range(_adaptive.CALM_REPORTS - 1):
        control.observe(_report(20), binding=False)
    assert control.saturated  # hysteresis
    control.observe(_report(20), binding=False)
    assert not control.saturated
    # Waiting within the slack: hold, not saturated anew.
    for _ in range(3):
        assert control.observe(_report(23, waiting=2), binding=True) == 23
    assert not control.saturated


def test_never_below_one() -> None:
    control = AdaptiveLimit(4)
    for k in range(10):
        assert control.observe(_report(0, waiting=3, preempted=k), binding=True) >= 1


class FakePool:
    """Answers each load request with the next of ``bodies`` (``None``: connection refused)."""

    def __init__(self, bodies: list[tuple[int, bytes] | None]) -> None:
        self.bodies = bodies
        self.asked = 0

    async def request(self, method: str, url: str, **kw: object) -> object:
        from trioforward import Phase
        from trioforward.http import PoolError

        self.asked += 1
        item = self.bodies.pop(0) if self.bodies else self.bodies_tail
        if item is None:
            raise PoolError("refused", phase=Phase.CONNECT)
        status, content = item

        class Response:
            pass

        r = Response()
        r.status, r.content = status, content  # type: ignore[attr-defined]
        return r

    bodies_tail: tuple[int, bytes] | None = None


def _metrics(running: int, waiting: int = 0, usage: float = 0.1, preempted: int = 0) -> tuple[int, bytes]:
    return 200, (
        f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
        f"vllm:kv_cache_usage_perc {usage}\nvllm:num_preemptions_total {preempted}\n"
    ).encode()


async def _run(engine: Engine, pool: FakePool, polls: int) -> None:
    engine.kind = "vllm"
    engine.kind_known.set()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: load_loop(pool, engine, interval=0.1, wait_s=1.0))  # type: ignore[arg-type]
        # One report every 0.1 s of the mock clock (the fake pool answers at once).
        await trio.sleep(0.1 * (polls - pool.asked) + 0.05)
        assert pool.asked == polls
        nursery.cancel_scope.cancel()


async def test_the_loop_sets_the_limit_and_falls_back_once_when_reports_vanish(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine("http://10.0.0.1:8000", 64)
    engine.queue.borrowed_tokens = 0
    engine.in_flight = 64  # the limit binds
    good = [_metrics(engine.in_flight)] * 3
    pool = FakePool([*good, None, (500, b"oops"), (200, b"garbage"), None])
    with caplog.at_level(logging.INFO, "trioforward.dispatch"):
        await _run(engine, pool, 7)
    assert engine.limit is None  # the static bound
    assert engine.queue.total_tokens == 64
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "back to its static capacity 64" in warnings[0].getMessage()
    # Good reports again: adaptation resumes from START.
    pool.bodies = [_metrics(0)]
    engine.in_flight = 0
    await _run(engine, pool, pool.asked + 1)
    assert engine.limit == START


async def test_a_report_frozen_at_idle_while_requests_run_is_stale(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = Engine("http://10.0.0.1:8000", 32)
    engine.in_flight = 5  # requests run there, the engine says it is idle
    pool = FakePool([])
    pool.bodies_tail = _metrics(0)
    await _run(engine, pool, _adaptive.STALE_REPORTS + _adaptive.FAILURES)
    assert engine.limit is None and engine.queue.total_tokens == 32


async def test_the_limit_follows_preemptions_and_never_exceeds_the_share(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = Engine("http://10.0.0.1:8000", 64)
    engine.set_share(20)  # a fleet share below what the reports allow
    engine.in_flight = 64
    pool = FakePool([_metrics(8), _metrics(16), _metrics(32), _metrics(24, preempted=3)])
    await _run(engine, pool, 4)
    assert engine.limit == 27  # the 24 that run + a slack of 3
    assert engine.queue.total_tokens == 20  # the smaller of the share and the limit
    engine.set_share(None)
    assert engine.queue.total_tokens == 27
    assert engine.info().limit == 27


async def test_an_openai_engine_keeps_its_static_bound(autojump_clock: trio.testing.MockClock) -> None:
    engine = Engine("http://10.0.0.1:8000", 16)
    engine.kind = "openai"
    engine.kind_known.set()
    pool = FakePool([])
    await load_loop(pool, engine, interval=0.1, wait_s=1.0)  # type: ignore[arg-type]
    assert pool.asked == 0 and engine.limit is None and engine.queue.total_tokens == 16


def test_unlimited_capacity_grows_without_bound() -> None:
    control = AdaptiveLimit(math.inf)
    for _ in range(10):
        control.observe(_report(control.limit, usage=None), binding=True)
    assert control.limit > 64
