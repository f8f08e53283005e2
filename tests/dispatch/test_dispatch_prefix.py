"""Prefix routing: the key, affinity, the load bound, membership changes (docs/dispatch.md)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from trioforward.dispatch.engines._prefix import PrefixRouter, prefix_key, request_prefix_key
from trioforward.dispatch.engines._routing import Router, rendezvous_score, stable_hash


class FakeEngine:
    """What routing reads of an engine, with a load the test sets."""

    def __init__(self, name: str) -> None:
        self.url = name
        self.seed = stable_hash(name)
        self.eligible = True
        self.outstanding = 0
        self.capacity = 0  # 0 = unlimited

    @property
    def free_slot(self) -> bool:
        return self.capacity == 0 or self.outstanding < self.capacity

    def __repr__(self) -> str:
        return self.url


def _engines(n: int) -> list[FakeEngine]:
    return [FakeEngine(f"http://10.0.0.{i}:8000") for i in range(n)]


def _body(prompt: object, model: str = "m") -> dict[str, object]:
    return {"model": model, "prompt": prompt}


def test_key_of_token_ids_text_and_chat() -> None:
    ids = list(range(10000, 10100))  # "10000,10001,..." : 600 bytes, 2 full blocks of 256
    key = prefix_key(_body(ids), 256)
    assert key is not None and len(key.chain) == 2
    assert prefix_key(_body(ids), 256) == key
    assert prefix_key(_body(np.array(ids, dtype=np.int32)), 256) == key  # an array renders alike
    longer = prefix_key(_body([*ids, 7] * 2), 256)
    assert longer is not None and longer.chain[:2] == key.chain  # an extension shares the chain
    assert longer.anchor != key.anchor  # ... not the anchor, as both are shorter than 256 ids
    assert prefix_key(_body([*ids, 7] * 2), 16).anchor == prefix_key(_body(ids), 16).anchor
    assert prefix_key(_body(ids, model="other"), 256) != key  # adapters do not share KV
    text = prefix_key(_body("x" * 520), 256)
    assert text is not None and len(text.chain) == 2
    chat = {"model": "m", "messages": [{"role": "user", "content": "y" * 300}]}
    assert len(prefix_key(chat, 256).chain) == 1  # type: ignore[union-attr]
    assert prefix_key(_body([ids, ids]), 256) == key  # a batch routes by its first prompt
    for bad in (None, [], "", {"x": 1}):
        assert prefix_key(_body(bad), 256) is None
    assert request_prefix_key(None, b'{"model":"m","prompt":[1,2,3]}', 256) is not None
    assert request_prefix_key({"model": "m"}, b"not json", 256) is None


def test_a_prompt_is_not_mistaken_for_one_it_is_a_string_prefix_of() -> None:
    # [.., 3] then [.., 34]: the rendering of the first is no prefix of the second's.
    short = prefix_key(_body([1] * 127 + [3]), 256)
    other = prefix_key(_body([1] * 127 + [34, 5]), 256)
    assert short is not None and other is not None
    assert short.chain[-1] not in other.chain


def test_same_prefix_same_engine_and_prefixes_spread() -> None:
    engines = _engines(4)
    router = PrefixRouter(1.25, table_size=0)
    owners = Counter()
    for i in range(400):
        key = prefix_key(_body([i] * 40), 256)
        assert key is not None
        first = router.pick(engines, key, None)
        assert all(router.pick(engines, key, None) is first for _ in range(3))
        owners[first] += 1
    assert set(owners) == set(engines) and min(owners.values()) > 60


def test_the_first_choice_is_the_same_in_every_process() -> None:
    # Fleet mode: gateways share no state, so the choice must not depend on the
    # process (Python's hash() is salted per process; the anchor is not).
    code = (
        "from trioforward.dispatch.engines._prefix import PrefixRouter, prefix_key\n"
        "from tests.dispatch.test_dispatch_prefix import _engines\n"
        "es = _engines(5)\n"
        "r = PrefixRouter(1.25, 0)\n"
        "print(' '.join(r.pick(es, prefix_key({'model': 'm', 'prompt': [i] * 40}, 256), None).url"
        " for i in range(50)))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


def test_a_continuation_follows_its_prompt() -> None:
    engines = _engines(4)
    router = PrefixRouter(1.25, table_size=100)
    turn = list(range(1000, 1060))
    owner = router.pick(engines, prefix_key(_body(turn), 256), None)  # type: ignore[arg-type]
    moved = 0
    for t in range(8):
        turn = [*turn, *range(t * 50, t * 50 + 37)]  # answer + new tokens
        key = prefix_key(_body(turn), 256)
        assert key is not None
        assert router.pick(engines, key, None) is owner
        fresh = PrefixRouter(1.25, table_size=0).pick(engines, key, None)
        moved += fresh is not owner  # without the table some turns would move
    assert moved > 0
    assert 1 <= len(router) <= 9  # at most one entry per prompt


def test_a_request_that_would_queue_takes_a_free_slot_within_the_bound() -> None:
    engines = _engines(3)
    key = prefix_key(_body(list(range(64))), 256)
    assert key is not None
    order = sorted(engines, key=lambda e: rendezvous_score(key.anchor, e.seed), reverse=True)
    router = PrefixRouter(4.0, table_size=0)
    # Unlimited capacity (engine_capacity 0): nothing queues, the first choice stays.
    order[0].outstanding = 2
    assert router.pick(engines, key, None) is order[0]
    # Its 2 slots are full: the next choice with a free slot takes the request.
    for e in engines:
        e.capacity = 2
    assert router.pick(engines, key, None) is order[1]
    # No other slot is free: it queues on its choice.
    order[1].outstanding = order[2].outstanding = 2
    assert router.pick(engines, key, None) is order[0]
    # A free slot is room even at the bound, ceil(1.1 * (2 + 3 + 2 + 1) / 3) = 3:
    # the request runs at once there.
    order[1].outstanding, order[1].capacity = 3, 4
    bounded = PrefixRouter(1.1, table_size=0)
    assert bounded.pick(engines, key, None) is order[1]
    order[1].outstanding = 4  # full: the next with a free slot
    order[2].outstanding = 0
    assert bounded.pick(engines, key, None) is order[2]


def test_bound_holds_under_a_hot_prefix() -> None:
    engines = _engines(4)
    router = PrefixRouter(1.25, table_size=1000)
    hot = prefix_key(_body([5] * 64), 256)
    assert hot is not None
    placed = Counter()
    for m in range(1, 201):
        if m % 3 == 0:  # some requests finish meanwhile
            busiest = max(engines, key=lambda e: e.outstanding)
            busiest.outstanding -= 1
        e = router.pick(engines, hot, None)
        assert e is not None
        e.outstanding += 1
        placed[e] += 1
        total = sum(x.outstanding for x in engines)
        assert max(x.outstanding for x in engines) <= math.ceil(1.25 * total / 4)
    # Most of the hot prefix stays on its first choice; the rest spills in order.
    first = max(placed, key=placed.__getitem__)
    assert placed[first] >= 200 / 4


def test_copies_over_the_bound_spill_to_one_engine() -> None:
    # A GRPO group's copies that find their engine at the bound go to the next
    # engine in the prompt's order, all of them while it has room, so only one
    # more engine prefills the prompt (not the least loaded, which alternates).
    engines = _engines(4)
    key = prefix_key(_body(list(range(2000, 2100))), 256)
    assert key is not None
    order = sorted(engines, key=lambda e: rendezvous_score(key.anchor, e.seed), reverse=True)
    for table_size in (100, 0):
        router = PrefixRouter(1.25, table_size=table_size)
        order[0].outstanding = 10
        for e in order[1:]:
            e.outstanding = 5
        placed = []
        for _ in range(6):
            e = router.pick(engines, key, None)
            assert e is not None
            e.outstanding += 1
            placed.append(e)
        # ceil(1.25 * (m + 1) / 4) lets order[1] grow from 5 to 10 (m = 25..29);
        # then the next in order, though order[3] is as loaded.
        assert placed == [order[1]] * 5 + [order[2]]


def test_removal_and_addition_move_only_that_engines_prefixes() -> None:
    engines = _engines(5)
    router = PrefixRouter(1.25, table_size=0)
    keys = [prefix_key(_body([i, i + 1] * 20), 256) for i in range(500)]
    before = [router.pick(engines, k, None) for k in keys]  # type: ignore[arg-type]
    gone = engines[2]
    after = [router.pick(engines[:2] + engines[3:], k, None) for k in keys]  # type: ignore[arg-type]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if a is not b]
    assert moved and all(b is gone for b, _ in moved)
    assert len(moved) == before.count(gone)
    # Pausing or ejecting (not eligible) moves the same prefixes; resuming brings them back.
    gone.eligible = False
    assert [router.pick(engines, k, None) for k in keys] == after  # type: ignore[arg-type]
    gone.eligible = True
    assert [router.pick(engines, k, None) for k in keys] == before  # type: ignore[arg-type]
    # An added engine takes prefixes only from the others, about 1/(n + 1) of them.
    new = FakeEngine("http://10.0.0.9:8000")
    grown = [router.pick([*engines, new], k, None) for k in keys]  # type: ignore[arg-type]
    moved_to = [(b, a) for b, a in zip(before, grown, strict=True) if a is not b]
    assert moved_to and all(a is new for _, a in moved_to)
    assert 500 / 6 / 2 < len(moved_to) < 500 / 6 * 2


def test_remembered_engine_that_left_is_replaced() -> None:
    engines = _engines(3)
    router = PrefixRouter(1.25, table_size=10)
    key = prefix_key(_body(list(range(1000, 1100))), 256)
    assert key is not None
    owner = router.pick(engines, key, None)
    assert owner is not None
    owner.eligible = False
    other = router.pick(engines, key, None)
    assert other is not None and other is not owner
    owner.eligible = True
    assert router.pick(engines, key, None) is other  # its KV is now there


def test_avoid_is_only_a_last_resort() -> None:
    engines = _engines(2)
    router = PrefixRouter(1.25, table_size=10)
    key = prefix_key(_body(list(range(1000, 1100))), 256)
    assert key is not None
    owner = router.pick(engines, key, None)
    assert owner is not None
    assert router.pick(engines, key, owner) is not owner
    engines[0].eligible = engines[1].eligible = False
    assert router.pick(engines, key, None) is None
    owner.eligible = True
    assert router.pick([owner], key, owner) is owner


def test_session_key_wins_over_the_prefix() -> None:
    engines = _engines(4)
    router = Router("prefix", prefix_table_size=0)
    session = Router("session")
    key = prefix_key(_body(list(range(1000, 1100))), 256)
    for s in range(20):
        h = stable_hash(f"s{s}")
        assert router.pick(engines, session=h, prefix=key) is session.pick(engines, session=h)
    assert router.pick(engines, prefix=key) is PrefixRouter(1.25, 0).pick(engines, key, None)  # type: ignore[arg-type]


def test_load_factor_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        PrefixRouter(0.9, 0)

