"""The session store: tenant-scoped, bounded, idle TTL, memory per session
(docs/sessions.md, "Lifetime and memory")."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from trioforward.sessions import SessionError, SessionStore, Turn

# The figure docs/sessions.md states for 10,000 two-turn sessions (heap, MiB).
MEMORY_LIMIT_MIB = 48


def _turn(prompt: int, sampled: int) -> Turn:
    return Turn(
        prompt_ids=np.arange(prompt, dtype=np.int32),
        token_ids=np.arange(sampled, dtype=np.int32),
        logprobs=np.zeros(sampled, dtype=np.float32),
        new_start=0, branch=False, branch_reason=None,
        weight_versions=[{"version": "v1", "start": 0, "end": sampled}],
        started=0.0, finished=0.0, engine="http://127.0.0.1:1", finish_reason="stop",
    )  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fill(store: SessionStore, n: int) -> None:
    for i in range(n):
        session = store.open("default", f"episode-{i}")
        session.turns += [_turn(100, 32), _turn(100 + 32 + 20, 32)]
        session.messages = [
            {"role": "user", "content": "x" * 400},
            {"role": "assistant", "content": "y" * 160},
            {"role": "user", "content": "z" * 80},
            {"role": "assistant", "content": "w" * 160},
        ]


def test_ten_thousand_sessions_fit_the_stated_memory_and_expiry_frees_them() -> None:
    clock = Clock()
    store = SessionStore(max_sessions=0, ttl=60.0, clock=clock)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _fill(store, 10_000)
        held = tracemalloc.get_traced_memory()[0] - before
        clock.now += 61.0
        assert store.expire() == 10_000
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    print(f"10,000 sessions: {held / 2**20:.1f} MiB held, {left / 2**20:.2f} MiB after expiry")
    assert held <= MEMORY_LIMIT_MIB * 2**20
    assert left <= held / 50  # expiry frees them
    assert len(store) == 0 and store.expired_total == 10_000


def test_idle_ttl_drops_only_sessions_unused_for_the_ttl() -> None:
    clock = Clock()
    store = SessionStore(ttl=10.0, clock=clock)
    store.open("default", "old")
    clock.now += 6
    store.open("default", "young")
    clock.now += 6  # old: 12 s idle, young: 6 s
    assert len(store) == 1
    with pytest.raises(SessionError) as gone:
        store.get("default", "old")
    assert gone.value.status == 404 and gone.value.code == "session_not_found"
    assert store.get("default", "young").id == "young"


def test_a_busy_session_is_not_expired_under_its_turn() -> None:
    clock = Clock()
    store = SessionStore(ttl=10.0, clock=clock)
    store.open("default", "running").busy = True
    clock.now += 100
    assert store.expire() == 0 and len(store) == 1


def test_sessions_are_the_tenants_own() -> None:
    store = SessionStore()
    store.open("team-a", "ep")
    with pytest.raises(SessionError) as other:
        store.get("team-b", "ep")
    assert other.value.status == 404
    assert [s.tenant for s in store.of_tenant("team-a")] == ["team-a"]
    assert list(store.of_tenant("team-b")) == []


def test_a_full_store_refuses_a_new_session_and_keeps_the_old() -> None:
    store = SessionStore(max_sessions=2)
    store.open("default", "a")
    store.open("default", "b")
    with pytest.raises(SessionError) as full:
        store.open("default", "c")
    assert full.value.status == 429 and full.value.code == "session_store_full"
    assert store.open("default", "a").id == "a" and len(store) == 2
    store.end("default", "a")
    assert store.open("default", "c").id == "c"
