"""The capacity split (pure): same answer everywhere, sums to the capacity, max-min fair."""

from __future__ import annotations

import itertools
import random

import pytest

from trioforward.fleet import fair_split


def test_busy_members_share_evenly_with_remainder_by_member_id() -> None:
    assert fair_split(8, {"c": 100, "a": 100, "b": 100}) == {"a": 3, "b": 3, "c": 2}


def test_a_small_demand_is_met_and_the_rest_goes_to_the_busy_member() -> None:
    assert fair_split(8, {"a": 2, "b": 100, "c": 0}) == {"a": 2, "b": 5, "c": 1}


def test_idle_capacity_is_spread_so_every_member_can_start_at_once() -> None:
    assert fair_split(8, {"a": 0, "b": 0, "c": 0}) == {"a": 3, "b": 3, "c": 2}


def test_more_members_than_capacity_each_hold_the_floor_of_one() -> None:
    assert fair_split(2, {"a": 5, "b": 5, "c": 5}) == {"a": 1, "b": 1, "c": 1}


def test_unlimited_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="unlimited"):
        fair_split(0, {"a": 1})


def test_random_snapshots_sum_to_capacity_and_are_max_min_fair() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        members = {f"m{i}": rng.choice([0, 1, 2, 5, 50]) for i in range(rng.randint(1, 6))}
        capacity = rng.randint(len(members), 40)
        shares = fair_split(capacity, members)
        assert sum(shares.values()) == capacity
        assert all(s >= 1 for s in shares.values())
        # Same answer whatever order the snapshot was read in.
        reordered = dict(sorted(members.items(), reverse=True))
        assert fair_split(capacity, reordered) == shares
        # Max-min fair: a member below its demand never has less than another
        # member's share minus one (integer remainder).
        for a, b in itertools.permutations(members, 2):
            if shares[a] < max(1, members[a]):
                assert shares[a] >= min(shares[b], max(1, members[b])) - 1
