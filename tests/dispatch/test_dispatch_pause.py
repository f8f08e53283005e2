"""Weight-update gating: pause/resume (docs/dispatch.md, "Pause and resume (weight updates)")."""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.dispatch import ForwardResponse
from trioforward.errors import DispatchAborted
from trioforward.sim import open_engine


async def test_requests_during_pause_wait_without_spending_dispatch_timeout(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, dispatch_timeout=1.0) as client,
    ):
        await client.pause()
        results: list[ForwardResponse] = []

        async def one() -> None:
            results.append(await client.post(COMPLETION, json=body(max_tokens=5)))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 5
            await trio.sleep(30)  # a long weight update: far past dispatch_timeout
            assert completions(engine) == 0
            await client.resume()
        assert [r.status for r in results] == [200] * 5
        assert all(r.queue_time >= 30 for r in results)
        assert all(r.engine_time < 1.0 for r in results)
        assert completions(engine) == 5


async def test_resume_releases_waiters_in_fifo_order(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine, engine_capacity=1) as client:
        await client.pause()
        order: list[int] = []

        async def one(i: int) -> None:
            await client.post(COMPLETION, json=body())
            order.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
                await trio.testing.wait_all_tasks_blocked()
            await client.resume()
        assert order == list(range(8))


async def test_pause_wait_returns_after_in_flight_finish(fd_baseline: int) -> None:
    async with (
        open_engine(decode_ms_per_token=50) as engine,
        client_for(engine) as client,
    ):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(partial(client.post, COMPLETION, json=body(max_tokens=4)))
            await engine.stats.wait_for(lambda s: s.running == 3)
            await client.pause(mode="wait")
            assert engine.stats.completed == 3 and engine.stats.running == 0
            assert client.engines.list()[0].paused and client.engines.list()[0].in_flight == 0
            await client.resume()


async def test_pause_abort_ends_in_flight_with_clear_error(fd_baseline: int) -> None:
    async with (
        open_engine(decode_ms_per_token=1000) as engine,
        client_for(engine) as client,
    ):
        errors: list[DispatchAborted] = []

        async def one() -> None:
            with pytest.raises(DispatchAborted) as info:
                await client.post(COMPLETION, json=body(max_tokens=50))
            errors.append(info.value)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 3)
            with trio.fail_after(10):
                await client.pause(mode="abort")
        assert len(errors) == 3
        for err in errors:
            assert err.status == 503 and "paused" in str(err) and err.engine == engine.url
            assert err.attempts == 1
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted == 3)
        await client.resume()
        engine.decode_ms_per_token = 0
        assert (await client.post(COMPLETION, json=body())).status == 200


async def test_paused_context_manager_and_partial_pause(fd_baseline: int) -> None:
    async with open_engine() as e1, open_engine() as e2, client_for(e1, e2) as client:
        async with client.paused([e1.url]):
            assert [i.paused for i in client.engines.list()] == [True, False]
            for _ in range(4):
                assert (await client.post(COMPLETION, json=body())).engine == e2.url
        assert [i.paused for i in client.engines.list()] == [False, False]
        with pytest.raises(KeyError):
            await client.pause(["http://127.0.0.1:1"])
        with pytest.raises(ValueError):
            await client.pause(mode="later")  # type: ignore[arg-type]


async def test_queued_requests_move_off_a_paused_engine(fd_baseline: int) -> None:
    async with (
        open_engine(decode_ms_per_token=1000) as busy,
        open_engine() as free,
        client_for(busy, free, engine_capacity=1, routing="round-robin") as client,
    ):
        async with trio.open_nursery() as nursery:

            async def long() -> None:
                with pytest.raises(DispatchAborted):
                    await client.post(COMPLETION, json=body(max_tokens=30))

            nursery.start_soon(long)
            await busy.stats.wait_for(lambda s: s.running == 1)
            results: list[ForwardResponse] = []

            async def one() -> None:
                results.append(await client.post(COMPLETION, json=body(), session=None))

            # Round-robin puts the next request in the busy engine's queue...
            client._dispatcher.router._turn = 0
            nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
            assert client.engines.list()[0].queued == 1
            # ...pausing the busy engine sends it to the other one at once.
            await client.pause([busy.url], mode="abort")
            await client.resume([busy.url])
        assert results[0].engine == free.url


async def test_engine_removal_aborts_in_flight(fd_baseline: int) -> None:
    async with open_engine(decode_ms_per_token=1000) as engine, client_for(engine) as client:
        async with trio.open_nursery() as nursery:

            async def one() -> None:
                with pytest.raises(DispatchAborted, match="removed"):
                    await client.post(COMPLETION, json=body(max_tokens=30))

            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            client.engines.remove(engine.url)
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted == 1)


async def test_pause_abort_ends_a_stream(fd_baseline: int) -> None:
    async with open_engine(decode_ms_per_token=200) as engine, client_for(engine) as client:
        chunks = 0
        with pytest.raises(DispatchAborted):
            async with client.stream(COMPLETION, json=body(max_tokens=50, stream=True)) as fs:
                async for _ in fs.aiter_bytes():
                    chunks += 1
                    if chunks == 1:
                        client._nursery.start_soon(partial(client.pause, mode="abort"))
        assert chunks >= 1
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted == 1)
        await client.resume()


async def test_one_engine_url_given_as_a_string_is_that_engine(fd_baseline: int) -> None:
    # A str is an Iterable[str]: it must not be read as one URL per character.
    async with open_engine() as a, open_engine() as b, client_for(a, b) as client:
        await client.pause(a.url)
        assert {e.url: e.paused for e in client.engines.list()} == {a.url: True, b.url: False}
        await client.resume(a.url)
        async with client.paused(f"{a.url}, {b.url}"):
            assert all(e.paused for e in client.engines.list())
        assert not any(e.paused for e in client.engines.list())
