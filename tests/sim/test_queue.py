"""The engine model: capacity, its own queue, prefill/decode time, prefill stalls."""

from __future__ import annotations

import math

import h11
import pytest
import trio
from simclient import Conn, Reply, request

from trioforward.sim import SimEngine, open_engine


async def _complete(
    engine: SimEngine, replies: list[Reply], max_tokens: int = 4, stream: bool = False
) -> None:
    body = {"prompt": [1, 2, 3], "max_tokens": max_tokens, "stream": stream}
    replies.append(await request(engine, "POST", "/v1/completions", body))


async def test_capacity_runs_n_and_queues_the_rest(fd_baseline: int) -> None:
    async with open_engine(capacity=2) as engine:
        engine.prefill_stall(math.inf)  # halt decoding: requests stay in flight
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(_complete, engine, replies)
            with trio.fail_after(10):
                await engine.stats.wait_for(lambda s: s.running == 2 and s.queued == 3)
            assert engine.stats.completed == 0
            engine.end_stall()
        assert [r.status for r in replies] == [200] * 5
        s = engine.stats
        assert (s.running, s.queued, s.peak_running, s.peak_queued, s.completed) == (0, 0, 2, 3, 5)


async def test_unlimited_capacity(fd_baseline: int) -> None:
    async with open_engine(capacity=0) as engine:
        engine.prefill_stall(math.inf)
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(_complete, engine, replies)
            with trio.fail_after(10):
                await engine.stats.wait_for(lambda s: s.running == 6)
            engine.end_stall()
        assert engine.stats.peak_queued == 0 and engine.stats.completed == 6


@pytest.mark.parametrize("stream", [False, True])
async def test_time_is_prefill_plus_decode(
    fd_baseline: int, autojump_clock: trio.abc.Clock, stream: bool
) -> None:
    async with open_engine(
        prefill_ms_per_token=100, decode_ms_per_token=1000, keep_alive=60
    ) as engine:
        start = trio.current_time()
        replies: list[Reply] = []
        await _complete(engine, replies, max_tokens=4, stream=stream)
        assert replies[0].status == 200
        assert trio.current_time() - start == pytest.approx(0.3 + 4.0)


async def test_queued_request_waits_for_a_slot(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(capacity=1, decode_ms_per_token=1000, keep_alive=60) as engine:
        start = trio.current_time()
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_complete, engine, replies)
            nursery.start_soon(_complete, engine, replies)
        assert trio.current_time() - start == pytest.approx(8.0)
        assert engine.stats.peak_running == 1 and engine.stats.peak_queued == 1


@pytest.mark.parametrize(("slowdown", "total"), [(math.inf, 6.0), (2.0, 5.0)])
async def test_prefill_stall_slows_running_decodes(
    fd_baseline: int, autojump_clock: trio.abc.Clock, slowdown: float, total: float
) -> None:
    async with open_engine(decode_ms_per_token=1000, keep_alive=60) as engine:
        start = trio.current_time()
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_complete, engine, replies)
            await trio.sleep(1.0)
            engine.prefill_stall(2.0, slowdown)
        # 4 s of decode; the 2 s stall adds 2 s (halted) or 1 s (half speed)
        assert trio.current_time() - start == pytest.approx(total)


async def test_stall_via_faults_endpoint(fd_baseline: int) -> None:
    async with open_engine() as engine:
        await request(engine, "POST", "/sim/faults", {"prefill_stall": None})  # no stall: no-op
        assert engine.instant
        await request(engine, "POST", "/sim/faults", {"prefill_stall": 1000})
        assert not engine.instant
        await request(engine, "POST", "/sim/faults", {"end_stall": True})
        assert engine.instant


async def test_no_byte_before_a_non_streaming_answer_is_done(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(keep_alive=None) as engine:
        engine.prefill_stall(math.inf)
        async with await Conn.open(engine) as conn:
            await conn.send("POST", "/v1/completions", {"prompt": [1], "max_tokens": 3})
            await engine.stats.wait_for(lambda s: s.running == 1)
            with trio.move_on_after(3600):  # virtual time: nothing may arrive while halted
                await conn.stream.receive_some(1)
                pytest.fail("a byte was written before the answer was done")
            engine.end_stall()
            assert (await conn.response()).status == 200


async def test_stream_chunks_arrive_one_per_decode_step(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(decode_ms_per_token=1000, keep_alive=None) as engine:
        async with await Conn.open(engine) as conn:
            start = trio.current_time()
            body = {"prompt": [1], "max_tokens": 3, "stream": True}
            await conn.send("POST", "/v1/completions", body)
            assert (await conn.head()).status_code == 200
            arrivals = []
            while True:
                event = await conn._event()
                if isinstance(event, h11.EndOfMessage):
                    break
                arrivals.append(
                    (round(trio.current_time() - start, 3), event.data.count(b"data: "))
                )
        # one token chunk per second; the last also carries [DONE]
        assert arrivals == [(1.0, 1), (2.0, 1), (3.0, 2)]
