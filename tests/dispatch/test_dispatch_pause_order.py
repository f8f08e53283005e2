"""Overlapping pause and resume calls, and an engine whose pause answer never came
(docs/operations.md, "Overlapping control calls")."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for

from trioforward.dispatch import ForwardResponse
from trioforward.errors import EngineControlError, PauseOvertaken
from trioforward.sim import SimEngine, open_engine


def gen() -> dict[str, object]:
    return body(prompt=[1, 2, 3], max_tokens=10, seed=3, return_token_ids=True)


async def post_into(client: object, out: list[ForwardResponse]) -> None:
    out.append(await client.post(COMPLETION, json=gen()))  # type: ignore[attr-defined]


async def served_after(client: object, engine: SimEngine) -> None:
    """A new request is dispatched, answered by the engine, and nothing is left paused."""
    assert not engine.rl.paused
    assert [e.paused for e in client.engines.list()] == [False]  # type: ignore[attr-defined]
    assert client.weights.engine_pauses == {}  # type: ignore[attr-defined]
    with trio.fail_after(60):  # autojump clock: a request held by a paused engine fails at once
        assert (await client.post(COMPLETION, json=gen())).status == 200  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_a_resume_overtaking_a_draining_wait_pause_leaves_nothing_paused(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, kind: str
) -> None:
    # With generations in flight, pause(engine_mode="wait") drains; a resume sent
    # meanwhile cuts it short (PauseOvertaken) and resumes what it reached: the
    # engine is not left paused behind an open gate (before: the resume did
    # nothing, the pause then paused the engine, new requests hung on it).
    async with (
        open_engine(decode_ms_per_token=100, kind=kind) as engine,
        client_for(engine, engine_kind=kind) as client,
    ):
        results: list[ForwardResponse] = []
        outcome: list[BaseException] = []

        async def pause() -> None:
            try:
                await client.pause(engine_mode="wait")
            except PauseOvertaken as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(post_into, client, results)
            await engine.stats.wait_for(lambda s: s.running == 3)
            nursery.start_soon(pause)
            await trio.testing.wait_all_tasks_blocked()
            assert client.engines.list()[0].paused  # gated, draining
            await client.resume(weight_version="v2")
        [exc] = outcome
        assert exc.status == 409 and exc.code == "pause_overtaken"
        assert [r.status for r in results] == [200] * 3  # the drained ones finished
        # vLLM got its /pause?mode=wait and was resumed; SGLang (the gateway drains
        # first, then pauses in place) was never asked, so never needs resuming.
        if kind == "vllm":
            assert engine.stats.pauses == {"wait": 1} and engine.stats.resumes == 1
        else:
            assert engine.stats.pauses == {} and engine.stats.resumes == 0
        await served_after(client, engine)
        assert engine.stats.completed == 4


async def test_a_pause_behind_another_waits_for_it_and_one_resume_undoes_both(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        results: list[ForwardResponse] = []
        order: list[str] = []

        async def pause(engine_mode: str) -> None:
            await client.pause(engine_mode=engine_mode)  # type: ignore[arg-type]
            order.append(engine_mode)

        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(post_into, client, results)
            await engine.stats.wait_for(lambda s: s.running == 2)
            nursery.start_soon(pause, "wait")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(pause, "abort")  # behind the draining wait: no abort
        assert order == ["wait", "abort"]
        assert [r.status for r in results] == [200, 200] and engine.stats.pause_aborted == 0
        assert engine.stats.pauses == {"wait": 1, "abort": 1} and engine.rl.paused
        await client.resume(weight_version="v2")
        assert engine.stats.resumes == 1
        await served_after(client, engine)


async def test_an_engine_whose_pause_answer_never_came_is_resumed(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # The engine pauses, its answer stalls past engine_control_timeout: the pause
    # fails (502 engine_control_failed) and the engine, which may be paused, is
    # resumed with the others (before: only engines that answered were).
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, engine_control_timeout=5.0) as client,
    ):
        await client.engines.wait_kind(engine.url)
        engine.faults.update({"paths": ["/pause"], "stall_headers": 1, "stall_seconds": math.inf})
        with pytest.raises(EngineControlError) as info:
            await client.pause(engine_mode="keep")
        assert info.value.status == 502 and info.value.engine == engine.url
        assert engine.stats.pauses == {"keep": 1} and engine.stats.faults["stall_headers"] == 1
        assert engine.stats.resumes == 1
        await served_after(client, engine)


async def test_an_engine_still_unreachable_after_an_unanswered_pause_stays_gated_until_a_resume(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # Its pause answer never came and its rollback resume fails too: it may be
    # paused, so it takes no work (gated, recorded) until a resume reaches it.
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, engine_control_timeout=5.0) as client,
    ):
        await client.engines.wait_kind(engine.url)
        engine.faults.update(
            {"paths": ["/pause", "/resume"], "stall_headers": 2, "stall_seconds": math.inf}
        )
        with pytest.raises(EngineControlError) as info:
            await client.pause(engine_mode="keep")
        assert "gated until a resume" in str(info.value)
        # (The sim ran the stalled /resume; the gateway cannot know it did.)
        assert engine.stats.resumes == 1 and client.engines.list()[0].paused
        assert list(client.weights.engine_pauses) == [engine.url]
        await client.resume()
        assert engine.stats.resumes == 2  # the stalled rollback (it took effect), then this one
        await served_after(client, engine)


async def test_an_engine_added_during_a_pause_of_all_is_gated_and_opened_by_the_resume(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine() as first,
        open_engine() as second,
        client_for(first) as client,
    ):
        await client.pause(engine_mode="keep")
        client.engines.add(second.url)
        assert [e.paused for e in client.engines.list()] == [True, True]
        assert list(client.weights.engine_pauses) == [first.url]  # no one paused the newcomer
        await client.resume()
        assert first.stats.resumes == 1 and second.stats.pauses == {} and second.stats.resumes == 0
        assert [e.paused for e in client.engines.list()] == [False, False]
        with trio.fail_after(60):
            for _ in range(2):
                assert (await client.post(COMPLETION, json=gen())).status == 200
