"""The future store on its own: ids, dedup, hold, delivery, retention and eviction."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trioforward.server.tinker._futures import (
    DELIVERED,
    EVICTED,
    READY,
    FutureGone,
    FutureStore,
    FutureUnknown,
    StoreFull,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(**kw: object) -> tuple[FutureStore, Clock]:
    clock = Clock()
    return FutureStore(clock=clock, epoch="0000abcd", **kw), clock  # type: ignore[arg-type]


def test_resubmit_with_same_key_returns_same_future() -> None:
    store, _ = make()
    a, created_a = store.submit(("s", 1), 2)
    b, created_b = store.submit(("s", 1), 2)
    c, _ = store.submit(("s", 2), 2)
    assert created_a and not created_b
    assert a is b and c is not a
    assert a.sample_sequence_ids == [f"{a.request_id}.0", f"{a.request_id}.1"]
    assert store.lookup_key(("s", 2)) is c
    assert store.statistics().deduplicated_total == 2
    assert store.statistics().outstanding == 2


def test_never_issued_is_unknown_and_evicted_is_gone() -> None:
    store, clock = make(retention=10.0)
    future, _ = store.submit(None, 1)
    with pytest.raises(FutureUnknown):
        store.get("nope")
    with pytest.raises(FutureUnknown):
        store.get("tf-0000abcd-99")  # our epoch, never reached by the counter
    with pytest.raises(FutureGone):
        store.get("tf-ffffffff-3")  # an earlier gateway process's id
    store.resolve(future, b"x", "application/x-protobuf")
    assert future.state == READY
    clock.now = 1000.0
    assert store.get(future.request_id) is future  # undelivered results do not expire
    store.mark_delivered(future)
    assert future.state == DELIVERED
    clock.now = 1009.0
    assert store.get(future.request_id).body == b"x"
    clock.now = 1010.0
    with pytest.raises(FutureGone):
        store.get(future.request_id)
    assert future.state == EVICTED


def test_retention_runs_from_first_delivery() -> None:
    store, clock = make(retention=5.0)
    future, _ = store.submit(("s", 0), 1)
    store.resolve(future, b"y", "t")
    store.mark_delivered(future)
    clock.now = 4.0
    store.mark_delivered(future)
    clock.now = 5.0
    with pytest.raises(FutureGone):
        store.get(future.request_id)
    # the key is free again: a later resubmit is a new sample
    again, created = store.submit(("s", 0), 1)
    assert created and again is not future


def test_retained_limit_evicts_delivered_first_then_oldest() -> None:
    store, _ = make(max_retained=2)
    f = [store.submit(None, 1)[0] for _ in range(4)]
    store.resolve(f[0], b"0", "t")
    store.resolve(f[1], b"1", "t")
    store.mark_delivered(f[1])
    store.resolve(f[2], b"2", "t")  # over the limit: delivered f1 goes first
    assert f[1].state == EVICTED and f[0].state == READY
    store.resolve(f[3], b"3", "t")  # then the oldest undelivered
    assert f[0].state == EVICTED
    assert store.statistics().ready == 2
    assert store.statistics().evicted_total == 2


def test_admission_control() -> None:
    store, _ = make(max_outstanding=2)
    a, _ = store.submit(("s", 0), 1)
    store.submit(("s", 1), 1)
    with pytest.raises(StoreFull):
        store.submit(("s", 2), 1)
    assert store.submit(("s", 1), 1)[1] is False  # a resubmit is always answered
    store.resolve(a, b"", "t")
    store.submit(("s", 2), 1)
    assert store.statistics().rejected_total == 1


async def test_wait_holds_then_times_out_and_wakes_on_resolve() -> None:
    store = FutureStore(hold=0.05)
    future, _ = store.submit(None, 1)
    assert await store.wait(future.request_id) is None  # held, then "try again"
    results: list[object] = []

    async def poll() -> None:
        results.append(await store.wait(future.request_id, hold=60))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        nursery.start_soon(poll)
        await trio.testing.wait_all_tasks_blocked()
        store.resolve(future, b"done", "t")
    assert results == [future, future]
    assert future.event is None


async def test_cancelled_wait_leaves_future_pending() -> None:
    store = FutureStore()
    future, _ = store.submit(None, 1)
    with trio.move_on_after(0.01):
        await store.wait(future.request_id, hold=60)
    store.resolve(future, b"late", "t")
    assert (await store.wait(future.request_id)) is future
