"""The step loop's pacing (docs/sim.md, "Engine model"): each step ends at the
previous step's scheduled end plus its own length, on trio's clock.

Run on a manual ``MockClock``: ``clock.jump`` stands in for a late wakeup (a
busy machine), so every time below is the clock's, never the wall's.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from trioforward.sim.core._stats import EngineStats
from trioforward.sim.physics._physics import EngineProfile
from trioforward.sim.physics._scheduler import MAX_LAG, Scheduler

# every step costs 12 ms, prefill or decode, whatever the batch
FLAT = EngineProfile("flat", step_s=0.012, seq_s=0.0, kv_token_s=0.0, prefill_token_s=0.0)
STEP = 0.012


def scheduler(stall: Callable[[], tuple[float, float]] = lambda: (1.0, 0.0), time_scale: float = 1.0) -> Scheduler:
    return Scheduler(
        FLAT, stats=EngineStats(), rl=SimpleNamespace(frozen=False),  # type: ignore[arg-type]
        cache=None, max_num_seqs=0, kv_cache_tokens=0, time_scale=time_scale, stall=stall, changed=trio.Event,
    )  # fmt: skip


@pytest.fixture
async def running(mock_clock: trio.testing.MockClock) -> AsyncIterator[Scheduler]:
    s = scheduler()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(s.run)
        yield s
        nursery.cancel_scope.cancel()


async def submit(s: Scheduler, prompt: list[int], output: list[int]) -> None:
    """Queue one sequence; return once the loop has planned its first step."""
    s.submit("m", [prompt], [output])
    await trio.testing.wait_all_tasks_blocked()


async def jump(clock: trio.testing.MockClock, seconds: float) -> None:
    clock.jump(seconds)
    await trio.testing.wait_all_tasks_blocked()


async def test_a_late_wakeup_shortens_the_next_sleep(mock_clock: trio.testing.MockClock, running: Scheduler) -> None:
    await submit(running, [7] * 16, [1] * 10)
    await jump(mock_clock, 0.015)  # the first step (due at 12 ms) wakes 3 ms late
    assert running.stats.tokens_decoded == 1
    await jump(mock_clock, 0.008)  # 23 ms: the second step is due at 24 ms, not 27
    assert running.stats.tokens_decoded == 1
    await jump(mock_clock, 0.001)
    assert running.stats.tokens_decoded == 2
    assert running.lag_drops == 0 and running.stats.lag_seconds == 0.0


async def test_behind_schedule_the_loop_catches_up_with_steps_back_to_back(
    mock_clock: trio.testing.MockClock, running: Scheduler
) -> None:
    await submit(running, [7] * 16, [1] * 10)
    await jump(mock_clock, 0.050)  # steps due at 12, 24, 36, 48 ms all run now
    assert running.stats.tokens_decoded == 4
    await jump(mock_clock, 0.009)  # the fifth is due at 60 ms
    assert running.stats.tokens_decoded == 4
    await jump(mock_clock, 0.001)
    assert running.stats.tokens_decoded == 5
    assert running.lag_drops == 0


async def test_far_behind_the_lateness_beyond_max_lag_is_dropped_and_counted(
    mock_clock: trio.testing.MockClock, running: Scheduler
) -> None:
    assert MAX_LAG == 0.25
    await submit(running, [7] * 16, [1] * 100)
    await jump(mock_clock, 1.0)  # the first step wakes 988 ms late
    # the second step, due at 24 ms, is moved to 750 ms (1.0 - MAX_LAG): 726 ms
    # dropped; then the steps due at 750 + 12·k ms ≤ 1.0 s run back to back
    assert running.lag_drops == 1 and running.stats.lag_drops == 1
    assert running.lag_seconds == pytest.approx(1.0 - MAX_LAG - 2 * STEP)
    assert running.stats.lag_seconds == running.lag_seconds
    assert running.stats.tokens_decoded == 1 + 21
    await jump(mock_clock, 0.0025)  # the next is due at 1.002 s, on the schedule again
    assert running.stats.tokens_decoded == 23
    assert running.lag_drops == 1


async def test_idle_time_and_a_halt_are_not_lateness(mock_clock: trio.testing.MockClock) -> None:
    halted_until = 0.0

    def stall() -> tuple[float, float]:
        now = trio.current_time()
        return (math.inf, halted_until) if now < halted_until else (1.0, 0.0)

    s = scheduler(stall, time_scale=0.5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(s.run)
        await submit(s, [7] * 16, [1] * 2)
        await jump(mock_clock, STEP)  # two steps of 6 ms wall (time_scale 0.5)
        assert s.stats.tokens_decoded == 2 and not s.running
        await jump(mock_clock, 10.0)  # idle
        halted_until = trio.current_time() + 5.0
        await submit(s, [8] * 16, [1] * 2)
        await jump(mock_clock, 5.0)  # halted, then the step starts from now
        await jump(mock_clock, 0.005)
        assert s.stats.tokens_decoded == 2
        await jump(mock_clock, 0.001)
        assert s.stats.tokens_decoded == 3
        assert s.lag_drops == 0 and s.lag_seconds == 0.0
        nursery.cancel_scope.cancel()
