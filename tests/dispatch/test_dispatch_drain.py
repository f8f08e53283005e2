"""Draining: a request still QUEUED when the client closes, or when a drain's cutoff
comes, raises ShuttingDown; dispatched requests run on (docs/embedding.md,
"Closing the client"; docs/server.md, "Shutdown")."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, FAST, assert_settled, body, client_for, completions

from trioforward import Phase
from trioforward.dispatch import Client, open_client
from trioforward.errors import ShuttingDown, TrioforwardError
from trioforward.sim import open_engine


class Outcomes(dict[str, Any]):
    """Each request's status or error, by name; :meth:`wait` for one."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = trio.Event()

    def __setitem__(self, name: str, value: Any) -> None:
        super().__setitem__(name, value)
        self.arrived.set()
        self.arrived = trio.Event()

    async def wait(self, name: str) -> Any:
        while name not in self:
            await self.arrived.wait()
        return self[name]


async def _send(client: Client, outcomes: Outcomes, name: str, max_tokens: int) -> None:
    try:
        outcomes[name] = (await client.post(COMPLETION, json=body(max_tokens=max_tokens))).status
    except TrioforwardError as err:
        outcomes[name] = err


async def _until_queued(client: Client, count: int) -> None:
    with trio.fail_after(10):
        while client.statistics().queued < count:
            await trio.testing.wait_all_tasks_blocked()
            await trio.lowlevel.checkpoint()


def _assert_shutting_down(err: object, attempts: int = 0) -> None:
    assert isinstance(err, ShuttingDown), err
    assert (err.status, err.code, err.phase) == (503, "shutting_down", Phase.QUEUED)
    assert err.attempts == attempts and err.engine_time == 0.0
    assert err.retry_after == 1
    assert err.to_json()["error"]["code"] == "shutting_down"


async def test_closing_the_client_ends_a_queued_request_and_lets_the_dispatched_one_finish(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    outcomes = Outcomes()
    async with open_engine(decode_ms_per_token=50) as engine:
        async with trio.open_nursery() as nursery:
            async with open_client(engines=[engine.url], engine_capacity=1, **FAST) as client:
                nursery.start_soon(_send, client, outcomes, "running", 40)
                await engine.stats.wait_for(lambda s: s.running == 1)
                nursery.start_soon(_send, client, outcomes, "queued", 4)
                await _until_queued(client, 1)
                closed_at = trio.current_time()
            # The queued request is answered as the block exits, not after the
            # running one (2 s of engine time) gave its capacity back.
            with trio.fail_after(1):
                await outcomes.wait("queued")
            assert trio.current_time() == closed_at
        _assert_shutting_down(outcomes["queued"])
        assert "the client was closed" in outcomes["queued"].message
        assert outcomes["running"] == 200
        assert completions(engine) == 1  # the queued one never reached the engine
        assert_settled(client)


async def test_closing_the_client_ends_a_request_waiting_for_an_ejected_engine_at_once(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # Every engine ejected: the request would wait up to unhealthy_timeout (60 s)
    # for a probe that no longer runs once the client is closed.
    outcomes = Outcomes()
    async with open_engine() as engine:
        async with trio.open_nursery() as nursery:
            async with open_client(
                engines=[engine.url], **{**FAST, "health_interval": 0.5, "health_failures": 1}
            ) as client:
                engine.faults.health_status = 503
                with trio.fail_after(10):
                    while client.engines.list()[0].healthy:
                        await client._registry.wait_changed()
                nursery.start_soon(_send, client, outcomes, "queued", 4)
                await _until_queued(client, 1)
                closed_at = trio.current_time()
        assert trio.current_time() - closed_at < 1.0  # not unhealthy_timeout's 60 s
        _assert_shutting_down(outcomes["queued"])
        assert completions(engine) == 0
        assert_settled(client)


async def test_a_request_after_the_client_closed_raises_shutting_down(fd_baseline: int) -> None:
    async with open_engine() as engine:
        async with client_for(engine) as client:
            assert (await client.post(COMPLETION, json=body())).status == 200
        with pytest.raises(ShuttingDown) as info:
            await client.post(COMPLETION, json=body())
        _assert_shutting_down(info.value)
        assert completions(engine) == 1


@pytest.mark.parametrize(("running_tokens", "queued_outcome"), [(20, 200), (1000, "shutting_down")])
async def test_a_drain_keeps_a_capacity_queue_until_its_cutoff(
    running_tokens: int,
    queued_outcome: object,
    fd_baseline: int,
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Cutoff 10 s ahead. A running request of 1 s (20 tokens x 50 ms) gives its
    # capacity back in time: the queued one runs (no work lost). One of 50 s
    # does not: the queued one is answered at the cutoff, never dispatched.
    outcomes = Outcomes()
    async with open_engine(decode_ms_per_token=50) as engine:
        async with client_for(engine, engine_capacity=1) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send, client, outcomes, "running", running_tokens)
                await engine.stats.wait_for(lambda s: s.running == 1)
                nursery.start_soon(_send, client, outcomes, "queued", 4)
                await _until_queued(client, 1)
                cutoff = trio.current_time() + 10.0
                client.begin_drain(cutoff)
                with trio.fail_after(60):
                    await outcomes.wait("queued")
                answered_at = trio.current_time()
                if queued_outcome == 200:
                    assert outcomes["queued"] == 200 and answered_at < cutoff
                else:
                    _assert_shutting_down(outcomes["queued"])
                    assert answered_at == pytest.approx(cutoff, abs=0.01)
                    assert "the gateway is shutting down" in outcomes["queued"].message
                    nursery.cancel_scope.cancel()  # the long one need not run out
        assert completions(engine) == (2 if queued_outcome == 200 else 1)


async def test_a_drain_keeps_a_request_waiting_for_a_paused_engine_until_its_cutoff(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # A weight-update pause may end within the grace: unlike an ejected fleet,
    # the wait is not hopeless, so the request keeps waiting until the cutoff.
    outcomes = Outcomes()
    async with open_engine() as engine:
        async with client_for(engine) as client:
            await client.pause()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send, client, outcomes, "queued", 4)
                await _until_queued(client, 1)
                cutoff = trio.current_time() + 10.0
                client.begin_drain(cutoff)
                with trio.fail_after(60):
                    err = await outcomes.wait("queued")
                assert trio.current_time() == pytest.approx(cutoff, abs=0.01)
            _assert_shutting_down(err)
            await client.resume()
        assert completions(engine) == 0
