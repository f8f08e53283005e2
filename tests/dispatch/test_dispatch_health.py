"""Health probes eject and re-admit engines; routing skips ejected ones (docs/design.md, "Engines, capacity and routing")."""

from __future__ import annotations

import pytest
import trio
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.dispatch import Client
from trioforward.errors import NoEngineAvailable
from trioforward.sim import open_engine


async def wait_health(client: Client, url: str, healthy: bool) -> None:
    with trio.fail_after(10):
        while next(e for e in client.engines.list() if e.url == url).healthy is not healthy:
            await client._registry.wait_changed()


async def test_eject_after_failures_readmit_after_success(fd_baseline: int) -> None:
    async with (
        open_engine() as e1,
        open_engine() as e2,
        client_for(e1, e2, health_interval=0.02, health_failures=3, health_successes=1) as client,
    ):
        e1.faults.health_status = 503
        await wait_health(client, e1.url, False)
        assert e1.stats.by_path["/health"] >= 3
        info = client.engines.list()[0]
        assert info.consecutive_failures >= 3 and not info.healthy
        before = completions(e1)
        for _ in range(6):
            assert (await client.post(COMPLETION, json=body())).engine == e2.url
        assert completions(e1) == before
        e1.faults.health_status = 200
        await wait_health(client, e1.url, True)
        engines = {(await client.post(COMPLETION, json=body())).engine for _ in range(4)}
        assert engines == {e1.url, e2.url}


async def test_unreachable_engine_ejected_by_probes(fd_baseline: int) -> None:
    async with open_engine() as e1, open_engine() as e2:
        async with client_for(e1, e2, health_interval=0.02, health_failures=2) as client:
            await e1.stop_listening()
            await wait_health(client, e1.url, False)
            for _ in range(4):
                assert (await client.post(COMPLETION, json=body())).engine == e2.url
            await e1.start_listening()
            await wait_health(client, e1.url, True)


async def test_connect_failures_during_dispatch_count_toward_ejection(fd_baseline: int) -> None:
    async with open_engine() as good, open_engine() as bad:
        async with client_for(bad, good, health_failures=2, routing="round-robin") as client:
            await bad.stop_listening()
            for _ in range(4):
                r = await client.post(COMPLETION, json=body())
                assert r.engine == good.url
            info = client.engines.list()[0]
            assert not info.healthy  # two connect failures ejected it; no probe ran
            assert client.statistics().retries[("connect", "connect_error")] == 2


async def test_all_ejected_requests_wait_for_readmission(fd_baseline: int) -> None:
    async with (
        open_engine() as engine,
        client_for(engine, health_interval=0.02, health_failures=1) as client,
    ):
        engine.faults.health_status = 503
        await wait_health(client, engine.url, False)
        async with trio.open_nursery() as nursery:
            results: list[int] = []

            async def one() -> None:
                results.append((await client.post(COMPLETION, json=body())).status)

            for _ in range(3):
                nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 3 and completions(engine) == 0
            engine.faults.health_status = 200
        assert results == [200, 200, 200]


@pytest.mark.parametrize("probe_timeout", [0.05])
async def test_stalled_health_endpoint_counts_as_failure(
    fd_baseline: int, probe_timeout: float
) -> None:
    async with open_engine() as engine:
        async with client_for(
            engine, health_interval=0.02, health_timeout=probe_timeout, health_failures=2
        ) as client:
            engine.faults.pause_accept = True  # connections sit in the backlog unanswered
            client._control_pool.close_idle()
            await wait_health(client, engine.url, False)
            engine.faults.pause_accept = False
            await wait_health(client, engine.url, True)


@pytest.mark.parametrize(("failures", "counted"), [(2, "2 consecutive failures"), (1, "1 consecutive failure")])
async def test_ejection_and_readmission_are_logged(
    failures: int, counted: str, fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="trioforward.dispatch")
    async with open_engine() as e1, open_engine() as e2:
        async with client_for(e1, e2, health_interval=0.02, health_failures=failures) as client:
            e1.faults.health_status = 503
            await wait_health(client, e1.url, False)
            e1.faults.health_status = 200
            await wait_health(client, e1.url, True)
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "trioforward.dispatch"]
    assert (
        "INFO",
        f"engine {e1.url} ejected after {counted}; 1 of 2 engine(s) healthy",
    ) in messages
    assert ("INFO", f"engine {e1.url} healthy again (re-admitted)") in messages


async def test_no_healthy_engine_fails_after_unhealthy_timeout_not_never(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # A dead fleet must not hold requests forever: after `unhealthy_timeout` the
    # caller gets NoEngineAvailable (503) and the engine saw no attempt.
    async with (
        open_engine() as engine,
        client_for(engine, health_interval=0.5, health_failures=1, unhealthy_timeout=30.0) as client,
    ):
        engine.faults.health_status = 503
        await wait_health(client, engine.url, False)
        start = trio.current_time()
        with pytest.raises(NoEngineAvailable) as info:
            await client.post(COMPLETION, json=body())
        assert trio.current_time() - start == pytest.approx(30.0, abs=0.6)
        assert "unhealthy_timeout" in str(info.value) and info.value.status == 503
        assert info.value.attempts == 0 and completions(engine) == 0


async def test_a_paused_fleet_is_waited_out_without_the_unhealthy_bound(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # A weight-update pause is not a failure: requests wait past unhealthy_timeout.
    async with (
        open_engine() as engine,
        client_for(engine, health_interval=0.5, unhealthy_timeout=1.0) as client,
    ):
        await client.pause()
        async with trio.open_nursery() as nursery:
            statuses: list[int] = []

            async def one() -> None:
                statuses.append((await client.post(COMPLETION, json=body())).status)

            nursery.start_soon(one)
            await trio.sleep(10.0)  # virtual time: ten times the unhealthy bound
            assert statuses == [] and client.statistics().queued == 1
            await client.resume()
        assert statuses == [200] and completions(engine) == 1
