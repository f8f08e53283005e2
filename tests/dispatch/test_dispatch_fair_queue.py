"""The engine queue on its own: start-time fair order, classes, cancellation, hand-over
(docs/dispatch.md, "Tenants and fair queueing")."""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from typing import Any

import pytest
import trio
import trio.testing

from trioforward.dispatch.engines._fair import FairQueue
from trioforward.dispatch.engines._fair_order import FairOrder
from trioforward.dispatch.engines._tenants import Tenant

FILLER = Tenant("filler")  # the tenant of the slots a test takes first
TENANT_OF: dict[str, Tenant] = {}  # request name -> tenant


class Req:
    """What the queue reads of a request."""

    def __init__(self, tenant: Tenant, name: str, session: int | None = None) -> None:
        TENANT_OF[name] = tenant
        self.tenant = tenant
        self.name = name
        self.session = session
        self.rerouted = False

    def __repr__(self) -> str:
        return self.name


async def _park(queue: FairQueue, nursery: trio.Nursery, reqs: list[Req], got: list[Any]) -> None:
    for r in reqs:

        async def wait(r: Req = r) -> None:
            q = await queue.take(r)  # type: ignore[arg-type]
            got.append((r.name, q))

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()


async def _serve(queue: FairQueue, got: list[Any], count: int) -> list[str]:
    """Free ``count`` slots one by one, each the slot of the request served last
    (the filler's first); the names of who got them, in order."""
    start = len(got)
    for _ in range(count):
        queue.give_back(TENANT_OF[got[-1][0]] if len(got) > start else _holder(queue))
        await trio.testing.wait_all_tasks_blocked()
    return [name for name, _ in got[start:]]


def _holder(queue: FairQueue) -> Tenant:
    """Who holds a slot of ``queue`` before a run of ``_serve``: the filler while it does."""
    if queue.running(FILLER):
        return FILLER
    return next(t for t in TENANT_OF.values() if queue.running(t))


async def test_weights_interleave_and_a_flow_stays_fifo() -> None:
    a, b = Tenant("a", weight=2), Tenant("b", weight=1)
    queue = FairQueue(1)
    assert queue.take_nowait(FILLER)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        await _park(queue, nursery, [Req(a, f"a{i}") for i in range(6)], got)
        await _park(queue, nursery, [Req(b, f"b{i}") for i in range(3)], got)
        assert len(queue) == 9 and not queue.take_nowait(FILLER)
        order = await _serve(queue, got, 9)
    # Start tags: a 0, .5, 1, 1.5, 2, 2.5; b 0, 1, 2: a tie goes to the flow that
    # was (re)queued first.
    assert order == ["a0", "b0", "a1", "b1", "a2", "a3", "b2", "a4", "a5"]
    assert len(queue) == 0 and queue.borrowed_tokens == 1


async def test_an_idle_tenant_earns_no_credit() -> None:
    a, b = Tenant("a"), Tenant("b")
    queue = FairQueue(1)
    assert queue.take_nowait(FILLER)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        await _park(queue, nursery, [Req(a, f"a{i}") for i in range(10)], got)
        assert await _serve(queue, got, 6) == [f"a{i}" for i in range(6)]
        # B arrives after A was served alone for six slots: it starts at the
        # current virtual time, not at 0 (which would give it the next six).
        await _park(queue, nursery, [Req(b, f"b{i}") for i in range(4)], got)
        order = await _serve(queue, got, 8)
        assert order == ["b0", "a6", "b1", "a7", "b2", "a8", "b3", "a9"]
        queue.give_back(TENANT_OF[got[-1][0]])


async def test_a_higher_class_first_and_fair_within_it() -> None:
    low, hi1, hi2 = Tenant("low", weight=50), Tenant("hi1", priority=2), Tenant("hi2", priority=2)
    queue = FairQueue(1)
    assert queue.take_nowait(FILLER)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        await _park(queue, nursery, [Req(low, f"l{i}") for i in range(3)], got)
        await _park(queue, nursery, [Req(hi1, f"x{i}") for i in range(2)], got)
        await _park(queue, nursery, [Req(hi2, f"y{i}") for i in range(2)], got)
        order = await _serve(queue, got, 7)
        queue.give_back(TENANT_OF[got[-1][0]])
    assert order == ["x0", "y0", "x1", "y1", "l0", "l1", "l2"]


async def test_a_cancelled_waiter_leaves_its_flow_at_once() -> None:
    a, b = Tenant("a"), Tenant("b")
    queue = FairQueue(1)
    assert queue.take_nowait(FILLER)
    got: list[Any] = []
    scopes: dict[str, trio.CancelScope] = {}
    async with trio.open_nursery() as nursery:
        for r in [Req(a, "a0"), Req(b, "b0"), Req(b, "b1")]:

            async def wait(r: Req = r) -> None:
                with trio.CancelScope() as scopes[r.name]:
                    got.append((r.name, await queue.take(r)))  # type: ignore[arg-type]

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
        scopes["b0"].cancel()
        scopes["b1"].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert len(queue) == 1 and sorted(r.name for r in queue) == ["a0"]  # type: ignore[attr-defined]
        assert await _serve(queue, got, 1) == ["a0"]
        # B's emptied flow left a stale heap entry: it is skipped, never served.
        await _park(queue, nursery, [Req(b, "b2")], got)
        assert await _serve(queue, got, 1) == ["b2"]
        queue.give_back(TENANT_OF[got[-1][0]])
    assert queue.borrowed_tokens == 0


async def test_raising_the_tokens_wakes_waiters_and_hand_over_gives_another_queues_slot() -> None:
    a = Tenant("a")
    home, other = FairQueue(1, "home"), FairQueue(2, "other")
    assert home.take_nowait(FILLER)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        pinned = Req(a, "pinned", session=7)
        await _park(home, nursery, [pinned, Req(a, "a1"), Req(a, "a2")], got)
        # Work conservation: the oldest request that may move (no session key).
        moved = home.hand_over(other)
        assert moved is not None and moved.name == "a1"  # type: ignore[attr-defined]
        await trio.testing.wait_all_tasks_blocked()
        assert got == [("a1", other)] and other.borrowed_tokens == 1 and len(home) == 2
        home.total_tokens = 3  # a larger fleet share: both waiters go at once
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(name for name, _ in got[1:]) == ["a2", "pinned"] and home.borrowed_tokens == 3
        assert home.hand_over(other) is None  # nothing parked
    with pytest.raises(ValueError):
        home.total_tokens = 0
    home.total_tokens = math.inf
    assert home.available_tokens == math.inf


def _slots(
    order: FairOrder[Any], count: int, grants: int, *, shuffled: bool = False
) -> Counter[str]:
    """``count`` slots served from ``order`` for ``grants`` more grants, the slot
    held longest freeing first (requests of one length) or, ``shuffled``, any of
    them (lengths vary; seeded). Per tenant: its grants, or with ``shuffled`` the
    slots it held summed over the grants (its share of the slots over time:
    which slot frees is random, so grant counts are noisy)."""
    holders = [order.pop()[0][0] for _ in range(count)]
    served: Counter[str] = Counter()
    rng = random.Random(7)
    for _ in range(grants):
        order.ended(TENANT_OF[holders.pop(rng.randrange(count) if shuffled else 0)])
        (name, _), _ = order.pop()
        holders.append(name)
        served.update(holders if shuffled else [name])
    return served


@pytest.mark.parametrize("slots", [2, 4, 10])
@pytest.mark.parametrize("shuffled", [False, True])
def test_weights_three_to_one_hold_on_few_slots_and_the_heaps_stay_small(
    slots: int, shuffled: bool
) -> None:
    heavy, light = Tenant("heavy", weight=3), Tenant("light", weight=1)
    order: FairOrder[Any] = FairOrder(counted=True)
    TENANT_OF.update(heavy=heavy, light=light)
    for i in range(12000):
        for t in (heavy, light):
            order.push(t, (t.name, i), None)
    served = _slots(order, slots, 10000, shuffled=shuffled)
    # 3:1 on 2 slots too: whole slots cannot state it at any moment, SFQ's
    # grants do over time.
    # Shuffled: the time average of the slots held, 3:1 give or take the
    # randomness of which slot frees (seeded: SFQ alone spreads as much).
    low, high = (2.8, 3.2) if shuffled else (2.85, 3.15)
    assert low <= served["heavy"] / served["light"] <= high, served
    # Stale entries are dropped: the heap holds a few entries per tenant.
    assert len(order._heap) <= 2 * 2 + 8


def _flooded(counted: bool = True) -> tuple[FairOrder[Any], deque[str]]:
    """An order of 8 slots all held by tenant "flood", which has 92 more queued;
    and who holds the slots, longest first."""
    flood = TENANT_OF["flood"] = Tenant("flood")
    order: FairOrder[Any] = FairOrder(counted=counted)
    for i in range(100):
        order.push(flood, ("flood", i), None)
    holders = deque(order.pop()[0][0] for _ in range(8))
    assert list(holders) == ["flood"] * 8 and order.running(flood) == 8
    return order, holders


def _turn(order: FairOrder[Any], holders: deque[str], count: int) -> list[str]:
    """``count`` times: the slot held longest frees and goes to the next in order;
    who got them."""
    got = []
    for _ in range(count):
        order.ended(TENANT_OF[holders.popleft()])
        got.append(order.pop()[0][0])
        holders.append(got[-1])
    return got


@pytest.mark.parametrize("counted", [True, False])
def test_a_newcomer_takes_as_many_slots_as_the_flood_held_then_they_alternate(
    counted: bool,
) -> None:
    order, holders = _flooded(counted)
    late = TENANT_OF["late"] = Tenant("late")
    for i in range(20):
        order.push(late, ("late", i), None)
    got = _turn(order, holders, 12)
    if counted:
        # The eight the flood held at the newcomer's arrival count as the
        # flood's lead: the next eight freed slots go to the newcomer, then the
        # two alternate (a tie goes to the flow backlogged first).
        assert got == ["late"] * 8 + ["flood", "late", "flood", "late"], got
    else:
        # Plain SFQ charges the flood for its slots when it takes them: the
        # newcomer starts level and gets every other slot.
        assert got == ["flood", "late"] * 6, got


def test_an_idle_tenant_without_credit_is_forgotten() -> None:
    # Requests built without a tenant each have one of their own: the queue must
    # not keep a flow per request once they are done.
    order: FairOrder[Any] = FairOrder(counted=True)
    for i in range(100):
        t = Tenant(f"once-{i}")
        order.started(t)
        order.ended(t)
    assert not order._flows


def test_a_tenant_that_comes_and_goes_stays_level_with_the_flood() -> None:
    # Each time eval comes back the flood holds every slot (eval's freed slots
    # went to it): that is the flood's lead again, and no more than that.
    order, holders = _flooded()
    eval_ = TENANT_OF["eval"] = Tenant("eval")
    served = Counter(holders)
    for round_ in range(3):  # eval sends 8, they run, they end, eval sends 8 again
        for i in range(8):
            order.push(eval_, ("eval", (round_, i)), None)
        got = _turn(order, holders, 8)
        served.update(got)
        assert got == ["eval"] * 8, (round_, got)
        assert served["eval"] == served["flood"] == 8 * (round_ + 1)
        while order.running(eval_):  # eval's requests end; the flood takes their slots
            order.ended(eval_)
            holders.remove("eval")
            holders.append(order.pop()[0][0])
            served["flood"] += 1


def test_a_newcomers_lead_stays_within_its_class() -> None:
    # A lower class running nothing does not pass a higher class running plenty.
    high, low = Tenant("high", priority=1), Tenant("low")
    order: FairOrder[Any] = FairOrder(counted=True)
    for i in range(20):
        order.push(high, ("high", i), None)
    for _ in range(8):
        assert order.pop()[0][0] == "high"
    for i in range(5):
        order.push(low, ("low", i), None)
    served = []
    for _ in range(12):
        order.ended(high)
        served.append(order.pop()[0][0])
    assert served == ["high"] * 12 and order.running(low) == 0
    order.ended(high)
    assert order.pop()[0][0] == "low"  # the higher class has nothing queued any more


def test_what_a_tenant_ran_uncontested_is_no_credit_to_a_later_one() -> None:
    # "low" runs alone in its class for long while a higher class keeps the
    # order non-empty; a later tenant of its class gets a lead of what "low"
    # holds then (4), not of everything it ran (40).
    high, low, later = Tenant("high", priority=1), Tenant("low"), Tenant("later")
    order: FairOrder[Any] = FairOrder(counted=True)
    order.push(high, ("high", 0), None)  # parked: the order is never empty below
    for _ in range(40):
        order.started(low)
        if order.running(low) > 4:
            order.ended(low)
    assert order.running(low) == 4
    for i in range(10):
        order.push(later, ("later", i), None)
        order.push(low, ("low", i), None)
    assert order.pop()[0][0] == "high"
    got = []
    for _ in range(8):
        order.ended(low)
        got.append(order.pop()[0][0])
    assert got[:4] == ["later"] * 4 and got[4:].count("low") == 2, got
