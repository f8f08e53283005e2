"""Retry budget and routing policies as pure functions."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from trioforward.dispatch.attempts._budget import RetryBudget
from trioforward.dispatch.engines._routing import Router, rendezvous_score, stable_hash


def test_budget_allows_ratio_of_requests_plus_floor() -> None:
    budget = RetryBudget(ratio=0.2, floor=0.0)
    for _ in range(100):
        budget.deposit(0.5)
    granted = sum(budget.try_withdraw(0.5) for _ in range(100))
    assert granted == 20


def test_budget_floor_per_second_over_window() -> None:
    budget = RetryBudget(ratio=0.0, floor=1.0, window=10)
    assert sum(budget.try_withdraw(100.0) for _ in range(50)) == 10


def test_budget_deposits_expire_after_window() -> None:
    budget = RetryBudget(ratio=0.5, floor=0.0, window=10)
    for _ in range(100):
        budget.deposit(0.0)
    assert budget.available(9.9) == pytest.approx(50)
    assert budget.available(10.5) == 0
    budget.deposit(11.0)
    assert budget.available(11.0) == pytest.approx(0.5)
    assert not budget.try_withdraw(11.0)


def test_budget_spent_then_refilled_by_new_requests() -> None:
    budget = RetryBudget(ratio=1.0, floor=0.0)
    assert not budget.try_withdraw(0.0)
    budget.deposit(0.1)
    assert budget.try_withdraw(0.2)
    assert not budget.try_withdraw(0.3)


@dataclass
class E:
    name: str
    eligible: bool = True
    in_flight: int = 0

    @property
    def outstanding(self) -> int:
        return self.in_flight

    @property
    def seed(self) -> int:
        return stable_hash(self.name)


def test_least_outstanding_picks_least_loaded() -> None:
    engines = [E("a", in_flight=3), E("b", in_flight=1), E("c", in_flight=2)]
    router = Router("least-outstanding")
    assert router.pick(engines) is engines[1]
    engines[1].eligible = False
    assert router.pick(engines) is engines[2]


def test_least_outstanding_ties_rotate() -> None:
    engines = [E("a"), E("b"), E("c")]
    router = Router("least-outstanding")
    picks = Counter(router.pick(engines).name for _ in range(30))  # type: ignore[union-attr]
    assert picks == {"a": 10, "b": 10, "c": 10}


def test_avoid_used_only_when_sole_choice() -> None:
    engines = [E("a"), E("b")]
    for policy in ("least-outstanding", "round-robin"):
        router = Router(policy)
        for _ in range(4):
            assert router.pick(engines, avoid=engines[0]) is engines[1]
        engines[1].eligible = False
        assert router.pick(engines, avoid=engines[0]) is engines[0]
        engines[1].eligible = True


def test_round_robin_cycles_over_eligible() -> None:
    engines = [E("a"), E("b"), E("c")]
    router = Router("round-robin")
    assert [router.pick(engines).name for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]  # type: ignore[union-attr]
    engines[1].eligible = False
    assert [router.pick(engines).name for _ in range(4)] == ["a", "c", "a", "c"]  # type: ignore[union-attr]


def test_none_when_nothing_eligible() -> None:
    engines = [E("a", eligible=False)]
    for policy in ("least-outstanding", "round-robin", "session"):
        assert Router(policy).pick(engines, session=1) is None
        assert Router(policy).pick([]) is None


def test_rendezvous_sticky_spread_and_minimal_movement() -> None:
    engines = [E(f"http://10.0.0.{i}:8000") for i in range(5)]
    router = Router("session")
    keys = [stable_hash(f"session-{i}") for i in range(2000)]
    owner = {k: router.pick(engines, session=k) for k in keys}
    assert all(router.pick(engines, session=k) is owner[k] for k in keys[:50])  # sticky
    spread = Counter(e.name for e in owner.values())  # type: ignore[union-attr]
    assert len(spread) == 5 and min(spread.values()) > 300
    # Taking one engine out moves only its sessions, each to its next engine in hash order.
    engines[2].eligible = False
    for k in keys:
        new = router.pick(engines, session=k)
        if owner[k] is not engines[2]:
            assert new is owner[k]
        else:
            ranked = sorted(engines, key=lambda e: rendezvous_score(k, e.seed), reverse=True)
            assert new is ranked[1]


def test_session_policy_without_key_is_least_outstanding() -> None:
    engines = [E("a", in_flight=5), E("b")]
    assert Router("session").pick(engines) is engines[1]


def test_stable_hash_is_stable() -> None:
    assert stable_hash("abc") == stable_hash("abc") != stable_hash("abd")
    assert 0 <= stable_hash("x") < 2**64
