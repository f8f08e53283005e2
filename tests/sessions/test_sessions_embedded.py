"""Sessions embedded over the dispatch client (docs/sessions.md, "Trajectories"):
numpy arrays, and a turn continued inside its session across a weight update."""

from __future__ import annotations

from typing import Any

import numpy as np
import trio
import trio.testing

import trioforward
from trioforward.sessions import SessionError, Sessions
from trioforward.sim import open_engine


async def test_embedded_turns_give_numpy_sequences_with_the_loss_mask(fd_baseline: int) -> None:
    async with open_engine() as engine, trioforward.open_client(engines=[engine.url]) as client:
        sessions = Sessions(client)
        messages = [{"role": "user", "content": "go"}]
        one = await sessions.chat("ep", messages, model="sim-base", max_tokens=5)
        messages += [one["choices"][0]["message"], {"role": "user", "content": "on"}]
        await sessions.chat("ep", messages, model="sim-base", max_tokens=3)
        try:  # embedded turns are whole answers (a stream is the gateway's)
            await sessions.chat("ep", messages, model="sim-base", max_tokens=3, stream=True)
            raise AssertionError("a streamed chat is refused")
        except SessionError as refused:
            assert refused.status == 400 and refused.code == "unsupported_in_session"
        sessions.reward("ep", 2.0)
        (seq,) = sessions.arrays("ep")
        prompts, sampled = list(engine.stats.prompts), list(engine.stats.sampled)
        trajectory = sessions.end("ep")
        try:
            sessions.get("ep")
            raise AssertionError("an ended session is gone")
        except SessionError as gone:
            assert gone.status == 404
        assert client.statistics().pool.active == 0
    assert seq["token_ids"].dtype == np.int32 and seq["loss_mask"].dtype == np.int8
    assert seq["logprobs"].dtype == np.float32 and seq["turns"] == (0, 1)
    assert seq["token_ids"].tolist() == prompts[1] + sampled[1][0]
    assert seq["loss_mask"].sum() == 8 and seq["loss_mask"][len(prompts[1]) :].tolist() == [1] * 3
    assert seq["token_ids"][len(prompts[0]) : len(prompts[0]) + 5].tolist() == sampled[0][0]
    assert np.all(seq["logprobs"][seq["loss_mask"] == 0] == 0) and np.all(
        seq["logprobs"][seq["loss_mask"] == 1] < 0
    )
    assert trajectory["rewards"] == {"reward": 2.0}


async def test_a_turn_continues_inside_its_session_across_an_abort_pause(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        trioforward.open_client(engines=[engine.url]) as client,
    ):
        sessions = Sessions(client)
        await client.resume(weight_version="v1")
        answers: list[dict[str, Any]] = []
        messages = [{"role": "user", "content": "go"}]

        async def turn() -> None:
            answers.append(await sessions.chat("ep", messages, model="sim-base", max_tokens=10))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(turn)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)  # four tokens decoded (virtual time)
            await client.pause(engine_mode="abort", replay="continue")
            await trio.sleep(30)  # the weights are pushed
            await client.resume(weight_version="v2")
        (answer,) = answers
        turn0 = sessions.trajectory("ep")["turns"][0]
        prompts = list(engine.stats.prompts)
    # Two engine generations: the first, then its continuation prompted with the
    # prompt + the 4 tokens the first produced; the session holds the joined turn.
    assert len(prompts) == 2 and prompts[1][: len(prompts[0])] == prompts[0]
    kept = prompts[1][len(prompts[0]) :]
    assert len(kept) == 4 and engine.stats.tokens_decoded == 10  # nothing decoded twice
    assert turn0["prompt_token_ids"] == prompts[0]
    assert turn0["token_ids"][:4] == kept and len(turn0["token_ids"]) == 10
    assert turn0["weight_versions"] == [
        {"version": "v1", "start": 0, "end": 4},
        {"version": "v2", "start": 4, "end": 10},
    ]
    assert answer["choices"][0]["weight_versions"] == turn0["weight_versions"]
