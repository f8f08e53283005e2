"""One test per row of the retry table (docs/semantics.md, "Retries"), against the simulated engine.

Each asserts the engine-side attempt count (``engine.stats``), and the client
helper asserts that no connection or capacity is left held (fds: ``fd_baseline``).
"""

from __future__ import annotations

import socket
from functools import partial

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.errors import DispatchTimeout, EngineConnectError, UpstreamBroken
from trioforward.http import Phase
from trioforward.sim import open_engine


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_connect_error_moves_to_another_engine(fd_baseline: int) -> None:
    async with open_engine() as good:
        dead = closed_port_url()
        # Round-robin starts with the first engine: the dead one.
        async with client_for(dead, good, routing="round-robin") as client:
            r = await client.post(COMPLETION, json=body())
            assert r.status == 200 and r.engine == good.url
            assert r.attempts == 2
            assert r.retries == (("connect", "connect_error"),)
            assert completions(good) == 1
            dead_info = client.engines.list()[0]
            assert dead_info.consecutive_failures == 1  # counts toward ejection


async def test_connect_errors_retried_with_growing_jittered_backoff(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    dead = closed_port_url()
    draws: list[float] = []
    for fixed in (0.0, 1.0):
        async with client_for(
            dead, connect_retries=4, backoff_initial=0.1, backoff_max=5.0
        ) as client:
            client._dispatcher.rand = lambda f=fixed: draws.append(f) or f  # type: ignore[func-returns-value]
            start = trio.current_time()
            with pytest.raises(EngineConnectError) as info:
                await client.post(COMPLETION, json=body())
            elapsed = trio.current_time() - start
            err = info.value
            assert err.attempts == 5 and err.phase is Phase.CONNECT and err.engine == dead
            port = dead.rsplit(":", 1)[1]
            assert str(err) == f"engine {dead}: connect to 127.0.0.1:{port} failed: Connection refused"
            assert err.status == 502
            # Delays are drawn from [b/2, b] with b = 0.1, 0.2, 0.4, 0.8: the
            # extremes of the jitter give the extremes of the total.
            expected = 0.75 if fixed == 0.0 else 1.5
            assert elapsed == pytest.approx(expected, abs=1e-6)
            assert client.statistics().retries == {("connect", "connect_error"): 4}
    assert len(draws) == 8


async def test_fresh_connection_failure_after_sending_not_retried(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        engine.faults.drop = 1  # read the request, close without a byte
        with pytest.raises(UpstreamBroken) as info:
            await client.post(COMPLETION, json=body())
        assert info.value.phase is Phase.AWAIT_HEADERS
        assert info.value.attempts == 1
        assert "engine closed the connection mid-exchange" in str(info.value)
        assert "h11" not in str(info.value) and "ConnectionClosed" not in str(info.value)
        assert completions(engine) == 1


async def test_reused_connection_zero_byte_failure_resent_once(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        assert (await client.post(COMPLETION, json=body())).status == 200
        engine.faults.drop = 1  # the keep-alive race: the reused connection dies unanswered
        calls: list[tuple[str, int, float]] = []
        r = await client.post(
            COMPLETION, json=body(), on_dispatch=lambda *call: calls.append(call)
        )
        assert r.status == 200 and r.attempts == 2
        assert [(url, attempt) for url, attempt, _ in calls] == [(r.engine, 1), (r.engine, 2)]
        assert all(queued >= 0.0 for _, _, queued in calls)
        assert r.retries == (("await_headers", "keepalive_race"),)
        assert completions(engine) == 3
        pool = client.statistics().pool
        assert pool.opened_total == 2  # the re-send went on a fresh connection


async def test_reused_then_fresh_failure_gives_up(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        assert (await client.post(COMPLETION, json=body())).status == 200
        engine.faults.drop = 2
        with pytest.raises(UpstreamBroken) as info:
            await client.post(COMPLETION, json=body())
        assert info.value.attempts == 2
        assert completions(engine) == 3


@pytest.mark.parametrize("status", [429, 502, 503, 504])
async def test_rejections_retried_honouring_retry_after(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, status: int
) -> None:
    async with (
        open_engine() as engine,
        client_for(engine, rejection_retries=1, backoff_max=5.0) as client,
    ):
        engine.faults.reject = 1
        engine.faults.reject_status = status
        engine.faults.retry_after = 2.0
        start = trio.current_time()
        r = await client.post(COMPLETION, json=body())
        assert r.status == 200 and r.attempts == 2
        assert r.retries == (("await_headers", f"rejection_{status}"),)
        assert trio.current_time() - start >= 2.0  # waited the engine's Retry-After
        assert completions(engine) == 2


async def test_rejections_exhausted_return_the_engine_answer(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine, rejection_retries=2) as client:
        engine.faults.reject = 10
        r = await client.post(COMPLETION, json=body())
        assert r.status == 503 and r.attempts == 3
        assert b"overloaded" in r.content
        assert completions(engine) == 3


async def test_retry_after_capped_by_backoff_max(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine() as engine, client_for(engine, backoff_max=0.5) as client:
        engine.faults.reject = 1
        engine.faults.retry_after = 3600.0
        start = trio.current_time()
        assert (await client.post(COMPLETION, json=body())).status == 200
        assert 0.5 <= trio.current_time() - start < 1.0


@pytest.mark.parametrize("status", [400, 404, 422, 500])
async def test_other_statuses_returned_after_one_attempt(fd_baseline: int, status: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        engine.faults.reject = 1
        engine.faults.reject_status = status
        r = await client.post(COMPLETION, json=body())
        assert r.status == status and r.attempts == 1 and r.retries == ()
        assert r.json()["error"]["code"] == status  # the engine's body, verbatim
        assert completions(engine) == 1


async def test_unknown_base_model_404_not_retried(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        r = await client.post(COMPLETION, json=body(model="no-such-model"))
        assert r.status == 404 and r.attempts == 1
        assert b"does not exist" in r.content
        assert engine.stats.by_model["no-such-model"] == 1
        assert sum(engine.stats.adapter_loads.values()) == 0
        assert engine.stats.by_path["/v1/load_lora_adapter"] == 0


async def test_read_body_failure_never_retried_and_engine_aborts(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine, read_timeout=0.2) as client:
        engine.faults.stall_body = 1  # headers and half the body, then silence
        with pytest.raises(DispatchTimeout) as info:
            await client.post(COMPLETION, json=body())
        assert info.value.phase is Phase.READ_BODY and info.value.attempts == 1
        assert info.value.status == 504
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted >= 1)
        assert completions(engine) == 1


async def test_await_headers_timeout_never_retried_and_engine_aborts(fd_baseline: int) -> None:
    # 20 tokens x 100 ms = 2 s of engine time against a 0.3 s dispatch budget.
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, dispatch_timeout=0.3) as client,
    ):
        with pytest.raises(DispatchTimeout) as info:
            await client.post(COMPLETION, json=body(max_tokens=20))
        err = info.value
        assert err.phase is Phase.AWAIT_HEADERS and err.attempts == 1
        assert 0.3 <= err.engine_time < 5 and err.queue_time < 0.3
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted >= 1)
        assert completions(engine) == 1 and engine.stats.completed == 0


async def test_caller_cancellation_not_retried_engine_aborts(fd_baseline: int) -> None:
    async with open_engine(decode_ms_per_token=1000) as engine, client_for(engine) as client:
        with trio.move_on_after(10) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(client.post, COMPLETION, json=body(max_tokens=20)))
                await engine.stats.wait_for(lambda s: s.running >= 1)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted >= 1)
        assert completions(engine) == 1
        assert client.statistics().retries == {}


async def test_rejection_retried_on_another_engine(fd_baseline: int) -> None:
    async with open_engine() as e1, open_engine() as e2:
        async with client_for(e1, e2, routing="round-robin") as client:
            e1.faults.reject = 1
            r = await client.post(COMPLETION, json=body())
            assert r.status == 200 and r.engine == e2.url and r.attempts == 2
            assert completions(e1) == 1 and completions(e2) == 1


async def test_dispatch_deadline_bounds_connect_retries(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    dead = closed_port_url()
    async with client_for(
        dead,
        connect_retries=10,
        backoff_initial=0.2,
        backoff_max=5.0,
        dispatch_timeout=0.5,
        health_failures=0,
    ) as client:
        start = trio.current_time()
        with pytest.raises(EngineConnectError) as info:
            await client.post(COMPLETION, json=body())
        # A backoff that would end past the deadline is not slept: the last error stands.
        assert trio.current_time() - start < 0.5
        assert 2 <= info.value.attempts < 11


async def test_engine_closing_after_every_response_never_fails_a_request(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        engine.faults.close_every = 1  # closes each connection right after its response
        for _ in range(20):
            r = await client.post(COMPLETION, json=body())
            assert r.status == 200 and r.attempts <= 2
            assert set(r.retries) <= {
                ("send", "keepalive_race"),
                ("await_headers", "keepalive_race"),
            }
        # Each request ran exactly once on the engine: a re-sent attempt had never
        # reached it (the connection was already closed).
        assert completions(engine) == 20
