"""The global retry budget stops retry storms (docs/design.md, "Retry rules")."""

from __future__ import annotations

import trio
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.sim import open_engine


async def test_retry_budget_bounds_attempts_when_every_engine_refuses(fd_baseline: int) -> None:
    n = 100
    async with (
        open_engine() as e1,
        open_engine() as e2,
        client_for(
            e1,
            e2,
            rejection_retries=5,
            retry_budget_ratio=0.2,
            retry_budget_min=0.5,
            backoff_initial=0.001,
            backoff_max=0.002,
        ) as client,
    ):
        for e in (e1, e2):
            e.faults.reject = 10**6
        statuses: list[int] = []

        async def one() -> None:
            statuses.append((await client.post(COMPLETION, json=body())).status)

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
        assert statuses == [503] * n
        attempts = completions(e1) + completions(e2)
        # Without a budget: 6 attempts each = 600. With it: 20 % of requests plus
        # the floor (0.5/s over the 10 s window).
        assert n <= attempts <= n + 0.2 * n + 5
        assert sum(client.statistics().retries.values()) == attempts - n


async def test_budget_spent_fails_connect_with_last_error(fd_baseline: int) -> None:
    from trioforward.errors import EngineConnectError

    async with open_engine() as engine:
        await engine.stop_listening()
        async with client_for(
            engine, retry_budget_ratio=0.0, retry_budget_min=0.0, health_failures=0
        ) as client:
            for _ in range(3):
                try:
                    await client.post(COMPLETION, json=body())
                except EngineConnectError as err:
                    assert err.attempts == 1
                else:  # pragma: no cover
                    raise AssertionError("expected EngineConnectError")
