"""Tenants share each engine's queue fairly: weights, priority classes, FIFO within a
tenant, work conservation, per-tenant max_outstanding (docs/dispatch.md, "Tenants and fair queueing")."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.dispatch import Client
from trioforward.errors import QueueFull, TenantQueueFull
from trioforward.sim import SimEngine, open_engine


def _tenants(**rows: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return rows


class Traffic:
    """Requests of named tenants, each with its own seed (engine-side identity),
    and the order the gateway dispatched them in."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.seed_of: dict[int, str] = {}  # seed -> tenant
        self.dispatched: list[str] = []  # tenant of each first attempt, in order
        self.errors: list[BaseException] = []
        self._next = 0

    def send(self, nursery: trio.Nursery, tenant: str, count: int, **extra: Any) -> list[int]:
        seeds = []
        for _ in range(count):
            seed = self._next
            self._next += 1
            self.seed_of[seed] = tenant
            seeds.append(seed)
            nursery.start_soon(self._one, tenant, seed, extra)
        return seeds

    async def _one(self, tenant: str, seed: int, extra: dict[str, Any]) -> None:
        def on_dispatch(engine: str, attempt: int, queue_time: float) -> None:
            if attempt == 1:
                self.dispatched.append(tenant)

        try:
            r = await self.client.post(
                COMPLETION, json=body(seed=seed, **extra), tenant=tenant, on_dispatch=on_dispatch
            )
            assert r.status == 200
        except (QueueFull, ValueError) as exc:
            self.errors.append(exc)

    def engine_order(self, *engines: SimEngine) -> list[str]:
        """Tenants in the order the engines first saw their requests' seeds."""
        order = [seed for e in engines for seed in e.stats.by_seed]
        return [self.seed_of[s] for s in order]


async def until(predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds, re-checked whenever every task is blocked."""
    with trio.fail_after(30):  # a hang guard only
        while not predicate():
            await trio.testing.wait_all_tasks_blocked(0.01)
            await trio.lowlevel.checkpoint()


async def _queued(client: Client, count: int) -> None:
    await until(lambda: client.statistics().queued >= count)


async def _admitted(client: Client, count: int) -> None:
    await until(lambda: (s := client.statistics()).queued + s.in_flight >= count)


async def test_equal_weights_a_newcomer_takes_every_freed_slot_until_level_with_the_flood(
    fd_baseline: int,
) -> None:
    tenants = _tenants(a={"keys": ["ka"]}, b={"keys": ["kb"]})
    async with (
        open_engine() as engine,
        client_for(engine, engine_capacity=8, tenants=tenants) as client,
    ):
        t = Traffic(client)
        engine.prefill_stall(math.inf)  # nothing finishes by itself
        async with trio.open_nursery() as nursery:
            # A's first eight hold the slots; each can be ended on its own (its
            # caller gives up: the slot frees), so slots free one at a time.
            scopes = []
            for seed in range(8):
                scope = trio.CancelScope()
                scopes.append(scope)
                nursery.start_soon(_held, client, scope, seed)
                t.seed_of[seed] = "a"
            t._next = 8
            await engine.stats.wait_for(lambda s: s.running == 8)
            t.send(nursery, "a", 32)
            await _queued(client, 32)
            t.send(nursery, "b", 8)  # B arrives behind A's whole flood
            await _queued(client, 40)
            for i, scope in enumerate(scopes):
                scope.cancel()  # one of A's slots frees
                await engine.stats.wait_for(lambda s, n=9 + i: len(s.by_seed) == n)
            order = t.engine_order(engine)
            # A held eight slots when B came: they are A's lead, so the eight
            # slots A frees all go to B (past its half, making up for its wait);
            # plain start-time fair queueing would alternate (b, a, b, a, ...).
            assert order[8:16] == ["b"] * 8, order[8:20]
            await engine.stats.wait_for(lambda s: s.aborted == 8)  # engine-side: the eight ended
            engine.end_stall()
        assert completions(engine) == 48
        assert client.statistics().tenants["b"].served == 8


async def _held(client: Client, scope: trio.CancelScope, seed: int) -> None:
    with scope:
        await client.post(COMPLETION, json=body(seed=seed), tenant="a")


async def test_weights_three_to_one_share_the_slots_three_to_one(fd_baseline: int) -> None:
    tenants = _tenants(heavy={"weight": 3}, light={"weight": 1})
    async with (
        open_engine() as engine,
        client_for(engine, engine_capacity=8, tenants=tenants) as client,
    ):
        t = Traffic(client)
        engine.prefill_stall(math.inf)
        async with trio.open_nursery() as nursery:
            t.send(nursery, "heavy", 8)  # these take the slots
            await _queued(client, 0)
            await engine.stats.wait_for(lambda s: s.running == 8)
            t.send(nursery, "heavy", 200)
            t.send(nursery, "light", 200)
            await _queued(client, 400)
            engine.end_stall()
        # Engine-side: heavy's 8 running when light came are its lead, 8/3 of
        # light's requests: light's first three are among the 8 granted when
        # the first 8 end (they reach the engine together, in any order; by
        # weight alone light would get 2). Then, while both are backlogged (the
        # next 200; heavy still has requests queued), 3:1.
        order = t.engine_order(engine)
        assert order[8:16].count("light") >= 3, order[8:16]
        window = order[16:216]
        assert len(window) == 200
        share = window.count("heavy") / window.count("light")
        assert 2.85 <= share <= 3.15, share
        assert completions(engine) == 408


async def test_a_higher_class_goes_first(fd_baseline: int) -> None:
    tenants = _tenants(batch={"priority": 0, "weight": 10}, eval={"priority": 1})
    async with (
        open_engine() as engine,
        client_for(engine, engine_capacity=2, tenants=tenants) as client,
    ):
        t = Traffic(client)
        engine.prefill_stall(math.inf)
        async with trio.open_nursery() as nursery:
            t.send(nursery, "batch", 30)
            await _queued(client, 28)
            t.send(nursery, "eval", 6)
            await _queued(client, 34)
            engine.end_stall()
        # Every queued eval request goes before any more batch work, whatever the weights.
        assert t.dispatched[2:8] == ["eval"] * 6
        assert completions(engine) == 36


async def test_a_lone_tenant_uses_every_slot(fd_baseline: int) -> None:
    tenants = _tenants(a={"weight": 1}, b={"weight": 100, "priority": 5})
    async with (
        open_engine(decode_ms_per_token=2) as e1,
        open_engine(decode_ms_per_token=2) as e2,
        client_for(e1, e2, engine_capacity=6, tenants=tenants) as client,
    ):
        t = Traffic(client)
        async with trio.open_nursery() as nursery:
            t.send(nursery, "a", 60, max_tokens=8)
        # Work-conserving: B's weight and class reserve nothing while B sends nothing.
        assert e1.stats.peak_running == 6 and e2.stats.peak_running == 6
        assert completions(e1) + completions(e2) == 60
        assert client.statistics().tenants["a"].served == 60


async def test_a_tenant_over_max_outstanding_is_refused_while_others_are_served(
    fd_baseline: int,
) -> None:
    tenants = _tenants(greedy={"max_outstanding": 3}, other={})
    async with (
        open_engine() as engine,
        client_for(engine, engine_capacity=2, tenants=tenants) as client,
    ):
        t = Traffic(client)
        engine.prefill_stall(math.inf)
        async with trio.open_nursery() as nursery:
            t.send(nursery, "greedy", 3)
            await _queued(client, 1)
            refused = []
            for _ in range(2):
                with pytest.raises(TenantQueueFull) as info:
                    await client.post(COMPLETION, json=body(), tenant="greedy")
                refused.append(info.value)
            t.send(nursery, "other", 4)
            await _queued(client, 5)
            engine.end_stall()
        err = refused[0]
        assert err.status == 429 and err.code == "tenant_queue_full" and err.tenant == "greedy"
        assert err.retry_after is not None and err.retry_after >= 1
        assert err.attempts == 0 and err.phase.value == "queued"
        # The refused requests never reached the engine; the others all did.
        assert completions(engine) == 7
        stats = client.statistics().tenants
        assert stats["greedy"].rejections == 2 and stats["greedy"].served == 3
        assert stats["other"].served == 4 and stats["other"].rejections == 0
        assert stats["greedy"].outstanding == 0


async def test_an_unknown_tenant_name_is_a_value_error(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine, tenants={"a": {}}) as client:
        with pytest.raises(ValueError, match="unknown tenant 'nope'.*a, default"):
            await client.post(COMPLETION, json=body(), tenant="nope")
        assert completions(engine) == 0
        # The default tenant (default_tenant) serves calls that name none.
        r = await client.post(COMPLETION, json=body())
        assert r.status == 200 and client.statistics().tenants["default"].served == 1


async def test_work_conservation_moves_the_next_request_of_the_fair_order(
    fd_baseline: int,
) -> None:
    # engine_capacity 1, one shared prefix: all of A's requests prefer one engine.
    knobs = {"engine_capacity": 1, "prefix_load_factor": 8.0, "prefix_tokens": 16}
    prompt = list(range(700, 764))
    async with (
        open_engine() as e1,
        open_engine() as e2,
        client_for(e1, e2, routing="prefix", tenants={"a": {}}, **knobs) as client,
    ):
        order: list[int] = []

        async def post(i: int, p: list[int]) -> None:
            def note(engine: str, attempt: int, queue_time: float) -> None:
                order.append(i)

            await client.post(COMPLETION, json=body(prompt=p, seed=i), tenant="a", on_dispatch=note)

        for e in (e1, e2):
            e.prefill_stall(math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, 0, prompt)
            await trio.testing.wait_all_tasks_blocked()
            home = next(e for e in (e1, e2) if e.stats.running == 1)
            other = e2 if home is e1 else e1
            nursery.start_soon(post, 99, list(range(9000, 9064)))  # the other slot
            await other.stats.wait_for(lambda s: s.running == 1)
            for i in range(1, 6):  # queued in order behind request 0 on its engine
                nursery.start_soon(post, i, prompt)
                await _queued(client, i)
            other.end_stall()  # the other slot frees: it takes A's oldest queued request
            await other.stats.wait_for(lambda s: completions_of(s) == 2)
            home.end_stall()
        assert list(other.stats.by_seed)[:2] == [99, 1]
        a_order = [i for i in order if i != 99]
        assert a_order == sorted(a_order)  # FIFO within the tenant, moves included
        assert completions(e1) + completions(e2) == 7


def completions_of(stats: Any) -> int:
    return int(stats.by_path[COMPLETION])


async def test_no_tenant_table_is_one_fifo_tenant(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine, engine_capacity=1) as client:
        order: list[int] = []
        engine.prefill_stall(math.inf)

        async def post(i: int) -> None:
            def note(engine: str, attempt: int, queue_time: float) -> None:
                order.append(i)

            await client.post(COMPLETION, json=body(seed=i), on_dispatch=note)

        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(post, i)
                await _admitted(client, i + 1)
            engine.end_stall()
        assert order == list(range(10))
        assert completions(engine) == 10
        assert set(client.statistics().tenants) == {"default"}
