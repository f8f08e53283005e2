"""The simulated engine's weight-update endpoints: vLLM dev mode and SGLang (docs/sim.md)."""

from __future__ import annotations

from functools import partial
from typing import Any

import orjson
import trio
import trio.testing
from simclient import Reply, request

from trioforward.sim import SimEngine, expected_tokens, open_engine

PROMPT = [5, 6, 7]


def gen_body(max_tokens: int = 10, **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-base",
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "seed": 1,
        "return_token_ids": True,
        **extra,
    }


async def generate(engine: SimEngine, out: list[Reply], **extra: Any) -> None:
    out.append(await request(engine, "POST", "/v1/completions", gen_body(**extra)))


def sse_events(body: bytes) -> list[Any]:
    events = [line[6:] for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    return [e if e == b"[DONE]" else orjson.loads(e) for e in events]


async def test_vllm_pause_abort_ends_running_requests_with_finish_reason_abort(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine(decode_ms_per_token=100) as engine:
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(generate, engine, replies)
            nursery.start_soon(partial(generate, engine, replies, stream=True))
            await engine.stats.wait_for(lambda s: s.running == 4)
            await trio.sleep(0.35)  # about 3 tokens decoded
            paused = await request(engine, "POST", "/pause?mode=abort")
            assert paused.status == 200 and paused.json() == {"status": "paused"}
        assert (await request(engine, "GET", "/is_paused")).json() == {"is_paused": True}
        whole = [r.json() for r in replies if r.headers["content-type"].startswith("application/json")]
        assert len(whole) == 3
        for answer in whole:
            choice = answer["choices"][0]
            assert choice["finish_reason"] == "abort"
            assert choice["token_ids"] == expected_tokens("sim-base", PROMPT, 1, 0, 10)[:3]
        [stream] = [r for r in replies if r.headers["content-type"].startswith("text/event-stream")]
        events = sse_events(stream.body)
        assert events[-1] == b"[DONE]" and events[-2]["choices"][0]["finish_reason"] == "abort"
        assert len(events) == 5  # three tokens, the abort event, [DONE]
        assert events[-2]["choices"][0]["token_ids"] == []  # vLLM: the abort event adds none
        assert [e["choices"][0]["token_ids"][0] for e in events[:3]] == whole[0]["choices"][0]["token_ids"]
        assert engine.stats.pause_aborted == 4 and engine.stats.completed == 4
        assert engine.stats.tokens_decoded == 4 * 3  # aborted work counted
        assert engine.stats.pauses == {"abort": 1}


async def test_requests_arriving_while_paused_are_held_until_resume(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine() as engine:  # instant, but not while paused
        await request(engine, "POST", "/pause?mode=abort")
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, replies)
            await engine.stats.wait_for(lambda s: s.held == 1)
            await trio.sleep(60)
            assert replies == [] and engine.stats.completed == 0
            assert (await request(engine, "POST", "/resume")).json() == {"status": "resumed"}
        assert replies[0].json()["choices"][0]["finish_reason"] == "length"
        assert engine.stats.held == 0 and engine.stats.resumes == 1
        assert (await request(engine, "GET", "/is_paused")).json() == {"is_paused": False}


async def test_vllm_pause_keep_freezes_decoding_until_resume(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine(decode_ms_per_token=100) as engine:
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, replies)
            await engine.stats.wait_for(lambda s: s.running == 1)
            start = trio.current_time()
            await trio.sleep(0.5)
            assert (await request(engine, "POST", "/pause?mode=keep")).status == 200
            await trio.sleep(30)  # frozen: time passes, no token
            assert replies == [] and engine.stats.running == 1
            update = await request(engine, "POST", "/update_weight_version", {"new_version": "v2"})
            assert update.json() == {"success": True, "new_version": "v2"}
            await request(engine, "POST", "/resume")
        # 1 s of decoding, plus the 30 s frozen.
        assert 31.0 <= trio.current_time() - start < 31.2
        choice = replies[0].json()["choices"][0]
        assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 10
        assert engine.stats.completed_mixed == 1  # decoded under two versions
        assert (await request(engine, "GET", "/weight_info")).json() == {"weight_version": "v2"}


async def test_vllm_pause_wait_answers_once_running_requests_finished(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine(decode_ms_per_token=100, capacity=1) as engine:
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, replies)
            nursery.start_soon(generate, engine, replies)  # queued behind the first
            await engine.stats.wait_for(lambda s: s.running == 1 and s.queued == 1)
            start = trio.current_time()
            assert (await request(engine, "POST", "/pause?mode=wait")).status == 200
            assert trio.current_time() - start >= 1.9  # both ran to their end
            assert len(replies) == 2 and engine.stats.completed_by_version == {"None": 2}
        for reply in replies:
            assert reply.json()["choices"][0]["finish_reason"] == "length"


async def test_vllm_abort_requests_and_bad_mode(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine(decode_ms_per_token=100) as engine:
        assert (await request(engine, "POST", "/pause?mode=later")).status == 422
        assert (await request(engine, "GET", "/is_paused")).json() == {"is_paused": False}
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, replies)
            await engine.stats.wait_for(lambda s: s.running == 1)
            aborted = await request(engine, "POST", "/abort_requests", {})
            assert aborted.json() == {"status": "aborted", "aborted": 1}
        assert replies[0].json()["choices"][0]["finish_reason"] == "abort"
        assert not engine.rl.paused  # aborting does not pause


async def test_sglang_in_place_freezes_and_abort_ends(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine(decode_ms_per_token=100, kind="sglang") as engine:
        assert (await request(engine, "POST", "/pause?mode=keep")).status == 404
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, replies)
            await engine.stats.wait_for(lambda s: s.running == 1)
            paused = await request(engine, "POST", "/pause_generation", {"mode": "in_place"})
            assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}
            await trio.sleep(10)
            assert replies == []
            update = {"new_version": "v7", "abort_all_requests": False}
            assert (await request(engine, "POST", "/update_weight_version", update)).json()[
                "success"
            ]
            cont = await request(engine, "POST", "/continue_generation", {})
            assert cont.json()["status"] == "ok"
        assert replies[0].json()["choices"][0]["finish_reason"] == "length"
        assert (await request(engine, "GET", "/model_info")).json()["weight_version"] == "v7"
        assert (await request(engine, "GET", "/get_weight_version")).status == 404  # gone in 0.5.21
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, replies)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await request(engine, "POST", "/pause_generation", {})  # SGLang's default: abort
        assert replies[1].json()["choices"][0]["finish_reason"] == "abort"
        assert (await request(engine, "POST", "/pause_generation", {"mode": "keep"})).status == 400
        assert engine.stats.pauses == {"in_place": 1, "abort": 1}


async def test_kind_none_serves_no_weight_update_endpoints(fd_baseline: int) -> None:
    async with open_engine(kind="none") as engine:
        for path in ("/pause", "/resume", "/pause_generation", "/update_weight_version"):
            assert (await request(engine, "POST", path)).status == 404
        assert (await request(engine, "GET", "/is_paused")).status == 404


async def test_tokens_decoded_counts_every_sequence_and_cut_work(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine() as engine:  # instant: whole answers, n sequences each
        await request(engine, "POST", "/v1/completions", gen_body(max_tokens=5, n=3))
        assert engine.stats.tokens_decoded == 15
    async with open_engine(decode_ms_per_token=100) as engine:
        await request(engine, "POST", "/v1/completions", gen_body(max_tokens=5, stream=True))
        assert engine.stats.tokens_decoded == 5
        with trio.move_on_after(0.25):  # the client leaves after two decode steps
            await request(engine, "POST", "/v1/completions", gen_body(max_tokens=5, n=2))
        await engine.stats.wait_for(lambda s: s.aborted == 1 and s.running == 0)
        assert engine.stats.tokens_decoded == 5 + 2 * 2



async def test_vllm_abort_of_a_request_already_answering_leaves_it_whole(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # Decoded in full, half its answer written (stall_body): an abort now finds
    # nothing to end, as vLLM's output for it is already made; the answer goes
    # out whole (before: it was answered a second time on a finished exchange).
    async with open_engine(decode_ms_per_token=100) as engine:
        engine.faults.stall_body = 1
        engine.faults.stall_seconds = 30.0
        replies: list[Reply] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, replies)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(5.0)  # 10 tokens of 100 ms: decoded, now in the stall
            assert engine.stats.faults["stall_body"] == 1
            aborted = await request(engine, "POST", "/abort_requests", {})
            assert aborted.json() == {"status": "aborted", "aborted": 0}
        (reply,) = replies
        assert reply.status == 200 and reply.json()["choices"][0]["finish_reason"] == "length"
        assert engine.stats.pause_aborted == 0 and engine.stats.completed == 1


async def test_abort_pause_answers_when_a_hang_up_lands_in_the_same_tick_as_the_abort(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The race of an abort pause with whole replay: the gateway closes a stream
    # just before /pause; the pause counts the run as owed an abort answer, and
    # the sim's disconnect watcher cancels the exchange before the run wakes.
    # The outer cancellation leaves the run's own cancelled scope, so no abort
    # answer is written: the pause must still answer (it waited forever).
    from trioforward.sim.core._rl import RLControl
    from trioforward.sim.core._stats import EngineStats

    rl = RLControl("vllm", EngineStats(), lambda: None)
    answered: list[str] = []

    async def aborted(run: Any) -> None:
        answered.append(run.rid)

    exchange = trio.CancelScope()  # what the disconnect watcher cancels

    async def decode(run: Any) -> None:
        await trio.sleep_forever()

    async def stream() -> None:
        with exchange:
            await rl.generation("cmpl-1-0", decode, aborted)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        await trio.testing.wait_all_tasks_blocked()
        assert len(rl.runs) == 1
        assert rl.abort() == 1  # the pause's abort ...
        exchange.cancel()  # ... and the hang-up, before the run wakes
        with trio.fail_after(60):  # autojump clock: a hang fails at once
            await rl.pause("abort")
    assert answered == [] and rl.runs == {} and rl.stats.pause_aborted == 1
