"""Dispatch-time deadlines and the QUEUED phase (docs/semantics.md, "Timeouts")."""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.dispatch import ForwardResponse
from trioforward.errors import DispatchTimeout, NoEngineAvailable, QueueFull, QueueTimeout
from trioforward.http import Phase
from trioforward.sim import open_engine


async def test_queue_wait_not_charged_to_dispatch_timeout(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # Capacity 4, 16 requests of 1 s engine time (4 tokens x 250 ms), budget 1.5 s:
    # the last ones wait ~3 s in QUEUED and still succeed.
    async with (
        open_engine(capacity=4, decode_ms_per_token=250) as engine,
        client_for(engine, engine_capacity=4, dispatch_timeout=1.5) as client,
    ):
        results: list[ForwardResponse] = []

        async def one() -> None:
            results.append(await client.post(COMPLETION, json=body(max_tokens=4)))

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(one)
        assert [r.status for r in results] == [200] * 16
        assert all(r.attempts == 1 for r in results)
        assert max(r.queue_time for r in results) >= 2.9
        assert max(r.engine_time for r in results) < 1.5
        assert engine.stats.peak_running == 4 and engine.stats.peak_queued == 0
        assert completions(engine) == 16


async def test_engine_time_beyond_budget_fails_and_engine_aborts(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(capacity=4, decode_ms_per_token=250) as engine,
        client_for(engine, engine_capacity=4, dispatch_timeout=1.5) as client,
    ):
        with pytest.raises(DispatchTimeout) as info:
            await client.post(COMPLETION, json=body(max_tokens=8))  # 2 s of engine time
        err = info.value
        assert err.phase in (Phase.AWAIT_HEADERS, Phase.READ_BODY)
        assert err.attempts == 1 and err.engine == engine.url
        assert err.engine_time == pytest.approx(1.5, abs=0.01)
        # The message names the knob, the phase and the engine once; no pool internals.
        assert err.message == f"dispatch_timeout passed ({err.phase.value}) on {engine.url}"
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted == 1)
        assert engine.stats.completed == 0


async def test_streamed_answer_past_budget_fails_in_read_body(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=250) as engine,
        client_for(engine, dispatch_timeout=1.0) as client,
    ):
        chunks = 0
        with pytest.raises(DispatchTimeout) as info:
            async with client.stream(COMPLETION, json=body(max_tokens=8, stream=True)) as fs:
                assert fs.status == 200
                async for _ in fs.aiter_bytes():
                    chunks += 1
        assert chunks >= 1
        assert info.value.phase is Phase.READ_BODY
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted == 1)


async def test_queue_timeout(fd_baseline: int, autojump_clock: trio.testing.MockClock) -> None:
    async with (
        open_engine(decode_ms_per_token=1000) as engine,
        client_for(engine, engine_capacity=1, queue_timeout=0.5) as client,
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(client.post, COMPLETION, json=body(max_tokens=2)))
            await engine.stats.wait_for(lambda s: s.running == 1)
            with pytest.raises(QueueTimeout) as info:
                await client.post(COMPLETION, json=body())
            err = info.value
            assert err.status == 503 and err.phase is Phase.QUEUED and err.attempts == 0
            assert err.queue_time == pytest.approx(0.5, abs=0.01)
        assert completions(engine) == 1


async def test_no_engine_registered_fails_at_once(fd_baseline: int) -> None:
    async with client_for() as client:
        with pytest.raises(NoEngineAvailable) as info:
            await client.post(COMPLETION, json=body())
        assert info.value.status == 503 and info.value.attempts == 0


async def test_no_eligible_engine_waits_until_queue_timeout(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine() as engine, client_for(engine, queue_timeout=2.0) as client:
        await client.pause()
        start = trio.current_time()
        with pytest.raises(NoEngineAvailable):
            await client.post(COMPLETION, json=body())
        assert trio.current_time() - start == pytest.approx(2.0)
        assert completions(engine) == 0
        await client.resume()


async def test_max_outstanding_rejects_beyond(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine, max_outstanding=2) as client:
        await client.pause()
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(partial(client.post, COMPLETION, json=body()))
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 2
            with pytest.raises(QueueFull) as info:
                await client.post(COMPLETION, json=body())
            assert info.value.status == 429
            await client.resume()
        assert completions(engine) == 2


async def test_removing_the_last_engine_fails_waiting_requests(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        await client.pause()
        async with trio.open_nursery() as nursery:

            async def one() -> None:
                with pytest.raises(NoEngineAvailable):
                    await client.post(COMPLETION, json=body())

            for _ in range(3):
                nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 3
            client.engines.remove(engine.url)
        assert completions(engine) == 0
