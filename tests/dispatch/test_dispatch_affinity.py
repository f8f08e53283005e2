"""Affinity bounded by the fleet: a hot prefix spreads, sessions move off a
saturated or overloaded engine with hysteresis, end on request and expire
(docs/dispatch.md, "Sessions that move")."""

from __future__ import annotations

import math

import trio

from trioforward.dispatch.engines._affinity import SessionAffinity
from trioforward.dispatch.engines._engines import Engine
from trioforward.dispatch.engines._prefix import PrefixRouter, prefix_key
from trioforward.dispatch.engines._routing import Router, rendezvous_score, stable_hash


class FakeEngine:
    """What routing reads of an engine: a load the test sets, ``slots`` slots."""

    def __init__(self, name: str, slots: int = 256) -> None:
        self.url = name
        self.seed = stable_hash(name)
        self.eligible = True
        self.outstanding = 0
        self.capacity = slots
        self.saturated = False

    @property
    def free_slot(self) -> bool:
        return self.outstanding < self.capacity

    def __repr__(self) -> str:
        return self.url


def _engines(n: int, slots: int = 256) -> list[FakeEngine]:
    return [FakeEngine(f"http://10.0.0.{i}:8000", slots) for i in range(n)]


def test_a_hot_prefix_spreads_over_two_engines_within_the_bound() -> None:
    # 24 concurrent requests sharing a 300-token prefix, each with its own tail,
    # on two engines of 256 slots (a free slot alone kept all 24 on one).
    engines = _engines(2)
    router = PrefixRouter(1.25, table_size=65536)
    shared = list(range(5000, 5300))
    for i in range(24):
        key = prefix_key({"model": "m", "prompt": [*shared, 90000 + i, 7, 7]}, 256)
        assert key is not None
        chosen = router.pick(engines, key, None)
        assert chosen is not None
        chosen.outstanding += 1
    loads = sorted(e.outstanding for e in engines)
    assert loads[0] > 0 and loads[1] <= math.ceil(1.25 * 12), loads


def test_the_floor_keeps_a_prefix_home_at_low_load() -> None:
    # 4 engines of 16 slots, 7 requests elsewhere: the mean bound is 3, the floor 8.
    engines = _engines(4, slots=16)
    key = prefix_key({"model": "m", "prompt": list(range(64))}, 256)
    assert key is not None
    home = max(engines, key=lambda e: rendezvous_score(key.anchor, e.seed))
    home.outstanding = 6
    assert PrefixRouter(1.25, 0).pick(engines, key, None) is home
    home.outstanding = 8  # at the floor and above the bound: it spreads
    assert PrefixRouter(1.25, 0).pick(engines, key, None) is not home
    assert PrefixRouter(1.25, 0, floor=0).pick(engines, key, None) is not home or home.outstanding < 3


def test_routing_counts_the_engines_reported_load() -> None:
    engine = Engine("http://10.0.0.9:8000", 64)
    engine.in_flight = 2
    assert engine.outstanding == 2
    engine.reported = 30  # other gateways' requests run there too
    assert engine.outstanding == 30


def _home(engines: list[FakeEngine], key: int) -> FakeEngine:
    return max(engines, key=lambda e: rendezvous_score(key, e.seed))


def test_a_session_moves_off_a_saturated_engine_once_and_stays() -> None:
    engines = _engines(3, slots=64)
    table = SessionAffinity(1.25)
    key = stable_hash("episode-1")
    home = _home(engines, key)
    assert table.pick(engines, key, None, 0.0) is home
    home.saturated = True  # it preempts / queues (its load reports)
    moved = table.pick(engines, key, None, 1.0)
    assert moved is not home and table.moves == 1
    # Hysteresis: the home calms down, the session stays where its KV now is.
    home.saturated = False
    assert table.pick(engines, key, None, 2.0) is moved and table.moves == 1
    # Every other engine saturated too: nowhere better, it stays.
    for e in engines:
        e.saturated = True
    assert table.pick(engines, key, None, 3.0) is moved and table.moves == 1


def test_a_session_moves_only_past_the_wider_bound() -> None:
    engines = _engines(2, slots=4)
    table = SessionAffinity(1.25, floor=0)
    key = stable_hash("episode-2")
    home = _home(engines, key)
    other = next(e for e in engines if e is not home)
    assert table.pick(engines, key, None, 0.0) is home
    # m = 10 + 4: placement bound ceil(1.25 * 15 / 2) = 10, move bound ceil(1.5 * 15 / 2) = 12.
    home.outstanding, other.outstanding = 10, 4
    assert table.pick(engines, key, None, 1.0) is home and table.moves == 0
    home.outstanding = 16  # m = 20: the move bound ceil(1.5 * 21 / 2) = 16 is reached
    assert table.pick(engines, key, None, 2.0) is other and table.moves == 1


def test_a_paused_home_gets_its_sessions_back() -> None:
    engines = _engines(3)
    table = SessionAffinity(1.25)
    key = stable_hash("episode-3")
    home = _home(engines, key)
    assert table.pick(engines, key, None, 0.0) is home
    home.eligible = False
    away = table.pick(engines, key, None, 1.0)
    assert away is not home and away is not None
    home.eligible = True
    assert table.pick(engines, key, None, 2.0) is home and table.moves == 0


def test_sessions_end_expire_and_stay_bounded() -> None:
    engines = _engines(3)
    table = SessionAffinity(1.25, size=100, ttl=60.0)
    for i in range(250):
        table.pick(engines, stable_hash(f"s{i}"), None, float(i) / 10)
    assert len(table) == 100  # the least recently used dropped
    assert table.finish(stable_hash("s249")) and not table.finish(stable_hash("s249"))
    assert len(table) == 99
    table.pick(engines, stable_hash("late"), None, 1000.0)  # all others idle > 60 s
    assert len(table) == 1


async def test_router_session_table_uses_trio_time(autojump_clock: trio.testing.MockClock) -> None:
    engines = _engines(2)
    router = Router("session", session_ttl=5.0)
    assert router.sessions is not None
    router.pick(engines, session=stable_hash("a"))
    assert len(router.sessions) == 1
    await trio.sleep(6)
    router.pick(engines, session=stable_hash("b"))
    assert len(router.sessions) == 1  # "a" expired
