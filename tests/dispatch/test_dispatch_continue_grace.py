"""abort_answer_grace: how long an abort pause with replay "continue" waits for the
engines' abort answers before closing what is still open (docs/operations.md)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for

from trioforward._settings import Settings, SettingsError
from trioforward.dispatch import ForwardResponse
from trioforward.sim import open_engine


@pytest.mark.parametrize("grace", [1.0, 7.0])
async def test_the_pause_waits_the_grace_for_a_request_the_engine_holds(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, grace: float
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, abort_answer_grace=grace) as client,
    ):
        await client.resume(weight_version="v1")
        await engine.rl.pause("abort")  # as vLLM 0.32 holds what reaches it after its pause
        out: list[ForwardResponse] = []

        async def one() -> None:
            out.append(
                await client.post(COMPLETION, json=body(max_tokens=10, return_token_ids=True))
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.held == 1)
            start = trio.current_time()  # the mock clock: virtual seconds
            await client.pause(engine_mode="abort", replay="continue")
            waited = trio.current_time() - start
            await client.resume(weight_version="v2")
        # The engine never answers the held request: the pause waited the grace for
        # it, then closed it; it ran again, whole, after the resume.
        assert grace <= waited < grace + 1.0
        [choice] = out[0].json()["choices"]
        assert len(choice["token_ids"]) == 10
        assert choice["weight_versions"] == [{"version": "v2", "start": 0, "end": 10}]
        assert engine.stats.tokens_decoded == 10


def test_the_grace_is_a_validated_knob() -> None:
    assert Settings().abort_answer_grace == 2.0
    assert Settings(abort_answer_grace=0.5).abort_answer_grace == 0.5
    with pytest.raises(SettingsError, match="abort_answer_grace"):
        Settings(abort_answer_grace=-1.0)
