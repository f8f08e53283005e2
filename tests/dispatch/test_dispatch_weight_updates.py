"""Weight updates: engine pause modes, replay, weight versions (docs/operations.md)."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for

from trioforward.dispatch import ForwardResponse
from trioforward.errors import DispatchAborted, EngineControlError, TrioforwardError
from trioforward.sim import expected_tokens, open_engine

PROMPT = [1, 2, 3]


def gen(max_tokens: int = 10) -> dict[str, object]:
    return body(prompt=PROMPT, max_tokens=max_tokens, seed=3, return_token_ids=True)


async def post_into(client: object, out: list[ForwardResponse], **kw: object) -> None:
    out.append(await client.post(COMPLETION, json=gen(), **kw))  # type: ignore[attr-defined]


async def test_keep_freezes_in_flight_and_answers_name_both_versions(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(post_into, client, results)
            await engine.stats.wait_for(lambda s: s.running == 4)
            await trio.sleep(0.5)
            await client.pause(engine_mode="keep")  # returns at once: nothing to wait for
            assert client.statistics().in_flight == 4 and engine.rl.paused
            await trio.sleep(60)  # the weight update
            assert results == []
            await client.resume(weight_version="v2")
        assert [r.status for r in results] == [200] * 4
        for r in results:
            assert r.json()["choices"][0]["token_ids"] == expected_tokens(
                "sim-base", PROMPT, 3, 0, 10
            )
            assert r.weight_version == "default, v2"  # decoded under both: the mode says so
        assert engine.stats.pauses == {"keep": 1} and engine.stats.resumes == 1
        assert engine.stats.completed_mixed == 4 and engine.rl.weight_version == "v2"
        assert client.weight_version == "v2"
        after = await client.post(COMPLETION, json=gen())
        assert after.weight_version == "v2"


async def test_abort_with_replay_gives_every_caller_one_whole_answer_from_new_weights(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(post_into, client, results)
            await engine.stats.wait_for(lambda s: s.running == 4)
            await trio.sleep(0.5)
            await client.pause(engine_mode="abort", replay=True)
            # The engine ended all four (finish_reason "abort"); none reached a caller.
            assert engine.stats.pause_aborted == 4 and results == []
            stats = client.statistics()
            assert stats.in_flight == 0 and stats.queued == 4
            await client.resume(weight_version="v2")
        assert [r.status for r in results] == [200] * 4
        for r in results:
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "length"
            assert choice["token_ids"] == expected_tokens("sim-base", PROMPT, 3, 0, 10)
            assert r.weight_version == "v2" and r.attempts == 2
        assert engine.stats.completed_by_version == {"v2": 4}
        assert engine.stats.by_path[COMPLETION] == 8  # each ran twice, once whole


async def test_abort_without_replay_fails_callers_and_never_hands_out_the_partial_answer(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        errors: list[DispatchAborted] = []

        async def one() -> None:
            with pytest.raises(DispatchAborted) as info:
                await client.post(COMPLETION, json=gen())
            errors.append(info.value)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 3)
            await client.pause(engine_mode="abort")
        assert len(errors) == 3 and all(e.status == 503 and e.engine == engine.url for e in errors)
        assert engine.stats.pause_aborted == 3
        await client.resume()


async def test_abort_replays_what_the_engine_did_not_end(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Requests the engine's abort pause leaves open (an engine without the pause
    # endpoints here; vLLM 0.32 holds a request that reached it after the pause and
    # runs it after /resume): the gateway closes them itself and replays them.
    caplog.set_level(logging.INFO, logger="trioforward.dispatch")
    async with (
        open_engine(decode_ms_per_token=100, kind="none") as engine,
        client_for(engine) as client,
    ):
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(post_into, client, results)
            await engine.stats.wait_for(lambda s: s.running == 2)
            await client.pause(engine_mode="abort", replay=True)
            await engine.stats.wait_for(lambda s: s.aborted == 2)  # connections closed
            await client.resume(weight_version="v9")
        assert [r.weight_version for r in results] == ["v9", "v9"]
        assert all(r.json()["choices"][0]["finish_reason"] == "length" for r in results)
        assert [r.attempts for r in results] == [2, 2]
    closed = [r.getMessage() for r in caplog.records if "still open after" in r.getMessage()]
    assert closed == [
        f"engine {engine.url}: 2 request(s) still open after its abort pause (not ended by"
        " the engine, or its answer not read yet): closed, replayed after resume"
    ]


async def test_abort_replays_a_request_the_engine_held_instead_of_ending(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # vLLM 0.32's abort pause ends what its scheduler holds; a request that reaches
    # it after the pause is held and runs after /resume, whole, on the new weights
    # (measured: docs/operations.md, "What vLLM 0.32 does under an abort pause").
    # Its answer would name both versions: the gateway closes it and replays it.
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        await engine.rl.pause("abort")  # the engine took a pause before ours reached it
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, results)
            await engine.stats.wait_for(lambda s: s.held == 1)
            await client.pause(engine_mode="abort", replay=True)
            # The engine ended nothing (the request was held, not running); the
            # gateway closed it: the engine sees the client leave.
            await engine.stats.wait_for(lambda s: s.aborted == 1 and s.held == 0)
            assert engine.stats.pause_aborted == 0 and client.statistics().queued == 1
            await client.resume(weight_version="v2")
        [r] = results
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["token_ids"] == expected_tokens("sim-base", PROMPT, 3, 0, 10)
        assert r.weight_version == "v2" and r.attempts == 2
        assert engine.stats.completed_by_version == {"v2": 1} and engine.stats.completed_mixed == 0
        assert engine.stats.by_path[COMPLETION] == 2


async def test_wait_returns_once_the_engines_drained(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(post_into, client, results)
            await engine.stats.wait_for(lambda s: s.running == 3)
            await client.pause(engine_mode="wait")
            assert len(results) == 3 and client.statistics().in_flight == 0
            assert engine.stats.pauses == {"wait": 1}
            nursery.start_soon(post_into, client, results)  # waits behind the gate
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 1
            await client.resume(weight_version="v2")
        assert [r.weight_version for r in results] == [None, None, None, "v2"]


async def test_a_failing_engine_pause_resumes_the_others_and_names_it(fd_baseline: int) -> None:
    async with (
        open_engine() as good,
        open_engine(kind="sglang") as bad,  # no /pause: vLLM's call gets 404
        client_for(good, bad, engine_kind="vllm") as client,
    ):
        with pytest.raises(EngineControlError) as info:
            await client.pause(engine_mode="keep")
        assert info.value.engine == bad.url and bad.url in str(info.value)
        assert "404" in str(info.value)
        assert good.stats.pauses == {"keep": 1} and good.stats.resumes == 1
        assert not good.rl.paused
        assert [e.paused for e in client.engines.list()] == [False, False]  # gate open again
        assert client.weights.engine_pauses == {}
        assert (await client.post(COMPLETION, json=gen())).status == 200


async def test_engine_kinds_are_detected_and_an_engine_without_endpoints_is_gated_only(
    fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        open_engine() as vllm,
        open_engine(kind="sglang") as sglang,
        open_engine(kind="none") as plain,
        client_for(vllm, sglang, plain) as client,
    ):
        with caplog.at_level(logging.WARNING, logger="trioforward.dispatch"):
            await client.pause(engine_mode="keep")
        pauses = client.weights.engine_pauses
        # engine_pauses lists the engines paused at the engine level: not the one
        # without endpoints, paused at the gateway only (a trainer reads it to
        # confirm its engines froze).
        assert {url: p.kind for url, p in pauses.items()} == {
            vllm.url: "vllm",
            sglang.url: "sglang",
        }
        assert vllm.stats.pauses == {"keep": 1} and sglang.stats.pauses == {"in_place": 1}
        assert plain.url in caplog.text and "gateway only" in caplog.text
        assert all(e.paused for e in client.engines.list())
        await client.resume(weight_version="step-7")
        assert vllm.rl.weight_version == "step-7" and sglang.rl.weight_version == "step-7"
        assert not vllm.rl.paused and not sglang.rl.paused and client.weights.engine_pauses == {}
        with pytest.raises(ValueError):
            await client.pause(engine_mode="later")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await client.resume(weight_version="")


async def test_a_stream_whose_head_went_out_is_ended_not_replayed(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        chunks: list[bytes] = []

        async def one() -> None:
            with pytest.raises(DispatchAborted):
                async with client.stream(COMPLETION, json={**gen(), "stream": True}) as fs:
                    async for chunk in fs.aiter_bytes():
                        chunks.append(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.35)
            await client.pause(engine_mode="abort", replay=True)
        assert b'"abort"' not in b"".join(chunks)  # the engine's truncated ending never relayed
        assert engine.stats.by_path[COMPLETION] == 1  # not replayed
        await client.resume()


@pytest.mark.parametrize("stream", [False, True])
async def test_time_frozen_on_a_keep_paused_engine_is_not_charged_to_the_dispatch_deadline(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, stream: bool
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, dispatch_timeout=5.0) as client,
    ):
        done: list[float] = []

        async def one() -> None:
            start = trio.current_time()
            if stream:
                async with client.stream(COMPLETION, json={**gen(), "stream": True}) as fs:
                    text = await fs.aread()
                assert text.endswith(b"data: [DONE]\n\n")
            else:
                assert (await client.post(COMPLETION, json=gen())).status == 200
            done.append(trio.current_time() - start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.5)
            await client.pause(engine_mode="keep")
            await trio.sleep(60)  # far past the 5 s dispatch deadline
            await client.resume()
        # 1 s of decoding plus the 60 s frozen, not a 504 at 5 s.
        assert 61.0 <= done[0] < 61.2
        assert engine.stats.completed == 1


async def frozen_past_the_deadline(
    dispatch_timeout: float, freeze_after: float, frozen: float
) -> tuple[TrioforwardError, float]:
    """A 100 s generation under ``dispatch_timeout``, keep-paused ``freeze_after`` s
    after dispatch for ``frozen`` s: the error it ends with and when (s after start)."""
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, dispatch_timeout=dispatch_timeout) as client,
    ):
        errors: list[TrioforwardError] = []

        async def one() -> None:
            with pytest.raises(TrioforwardError) as info:
                await client.post(COMPLETION, json=gen(max_tokens=1000))
            errors.append(info.value)

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(freeze_after)
            await client.pause(engine_mode="keep")
            await trio.sleep(frozen)
            await client.resume()
        ended = trio.current_time() - start
        await engine.stats.wait_for(lambda s: s.aborted == 1)
        return errors[0], ended


async def test_the_moved_deadline_still_holds_after_resume(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    error, ended = await frozen_past_the_deadline(5.0, freeze_after=1.0, frozen=30)
    # Deadline 5 s after dispatch, moved by the 30 s frozen: a 504 at 35 s.
    assert error.status == 504 and error.code == "dispatch_timeout"
    assert 35.0 <= ended < 35.1


async def test_time_frozen_on_a_keep_paused_engine_is_not_charged_to_the_read_timeout(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # read_timeout bounds the silence between body bytes: a stream frozen 30 s
    # by a keep pause is silent 15 times as long, yet is not a timeout.
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, read_timeout=2.0) as client,
    ):
        done: list[float] = []

        async def one() -> None:
            start = trio.current_time()
            async with client.stream(COMPLETION, json={**gen(), "stream": True}) as fs:
                text = await fs.aread()
            assert text.endswith(b"data: [DONE]\n\n")
            done.append(trio.current_time() - start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.5)
            await client.pause(engine_mode="keep")
            await trio.sleep(30)  # 15 times the read timeout without a byte
            await client.resume()
        assert 31.0 <= done[0] < 31.2  # 1 s of decoding plus the 30 s frozen
        assert engine.stats.completed == 1 and engine.stats.by_path[COMPLETION] == 1


async def test_a_freeze_that_begins_just_before_the_deadline_does_not_wake_the_request_in_small_steps(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # While frozen, the moved deadline is only known at resume; asking "if it resumed
    # now" would move it by the time frozen so far — 1 ms, then 2 ms, ... — and wake
    # the request every millisecond of a 10 s pause.
    from trioforward.dispatch.attempts._request import FROZEN_RECHECK, Request

    asked = 0
    original = Request.extended_deadline

    def counting(self: Request) -> float:
        nonlocal asked
        asked += 1
        return original(self)

    monkeypatch.setattr(Request, "extended_deadline", counting)
    error, ended = await frozen_past_the_deadline(1.0, freeze_after=0.999, frozen=10)
    assert error.status == 504  # the budget left at the freeze, spent after resume
    assert 11.0 <= ended < 11.0 + 2 * FROZEN_RECHECK
    assert asked <= 10 / FROZEN_RECHECK + 10  # one recheck a FROZEN_RECHECK, not a ms


async def test_client_pause_refuses_a_replay_with_nothing_to_replay(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        with pytest.raises(ValueError, match="'replay' re-runs requests the pause ended"):
            await client.pause(engine_mode="keep", replay=True)
        with pytest.raises(ValueError, match="send one of the two"):
            await client.pause(mode="abort", engine_mode="wait")
        assert [e.paused for e in client.engines.list()] == [False]
        assert not engine.rl.paused
