"""BurstGC: pauses automatic collection while many data-plane requests are in flight."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from trioforward.server.app._serve import tune_gc
from trioforward.server.front import _gc


@pytest.fixture
def gc_state() -> Iterator[None]:
    """Restores the collector's state, thresholds, frozen set and the process guard."""
    enabled, threshold, frozen = gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()
    previous = _gc.active
    yield
    _gc.install(previous)
    if frozen == 0:
        gc.unfreeze()
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def test_pauses_above_high_and_resumes_at_low(gc_state: None) -> None:
    gc.enable()
    guard = _gc.BurstGC(high=4, low=1)
    for _ in range(3):
        guard.enter()
    assert gc.isenabled()
    guard.enter()  # 4 in flight
    assert not gc.isenabled() and guard.pauses == 1
    guard.enter()
    for _ in range(3):
        guard.exit()  # 2 left
    assert not gc.isenabled()
    frozen = gc.get_freeze_count()
    guard.exit()  # 1 left: resume, survivors frozen
    assert gc.isenabled() and guard.paused_at is None
    assert gc.get_freeze_count() >= frozen
    guard.exit()
    assert guard.in_flight == 0 and gc.isenabled()


def test_periodic_full_collection_on_resume(gc_state: None) -> None:
    gc.enable()
    guard = _gc.BurstGC(high=2, low=0, clean_interval=0.0)
    guard.enter()
    guard.enter()
    assert not gc.isenabled()
    guard.exit()
    guard.exit()
    assert gc.isenabled() and guard.cleans == 1


def test_leaves_a_disabled_collector_alone(gc_state: None) -> None:
    gc.disable()
    guard = _gc.BurstGC(high=2, low=0)
    for _ in range(3):
        guard.enter()
    for _ in range(3):
        guard.exit()
    assert not gc.isenabled() and guard.pauses == 0


def test_long_pause_runs_a_young_collection(gc_state: None) -> None:
    gc.enable()
    guard = _gc.BurstGC(high=1, low=0, max_pause=0.0)
    for _ in range(2048):
        guard.enter()
    assert guard.forced >= 1 and not gc.isenabled()
    for _ in range(2048):
        guard.exit()
    assert gc.isenabled()


def test_bad_bounds() -> None:
    with pytest.raises(ValueError):
        _gc.BurstGC(high=4, low=4)


def test_tune_gc_installs_a_guard_and_install_resumes(gc_state: None) -> None:
    gc.enable()
    tune_gc()
    guard = _gc.active
    assert isinstance(guard, _gc.BurstGC)
    for _ in range(guard.high):
        guard.enter()
    assert not gc.isenabled()
    _gc.install(None)  # replacing the guard ends its pause
    assert gc.isenabled() and _gc.active is None


@pytest.mark.parametrize("stock_hypercorn", [False, True], ids=["our-worker", "stock-hypercorn"])
async def test_a_served_request_counts_once_while_in_flight(
    gc_state: None, fd_baseline: int, stock_hypercorn: bool
) -> None:
    # Under our worker the request is counted when its app task is spawned (a
    # burst's tasks are all spawned before any runs); under another server the
    # front counts it. Either way once, and never left counted.
    import orjson
    import trio
    import trio.testing
    from gateway_harness import open_gateway, open_sim
    from test_disconnect import send_raw

    gc.enable()
    guard = _gc.BurstGC(high=1_000, low=0)
    _gc.install(guard)
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(
        engine.url, stock_hypercorn=stock_hypercorn
    ) as gw:
        client = await send_raw(gw.url, {"model": "sim-base", "prompt": "x", "max_tokens": 10})
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.running == 1)
        assert guard.in_flight == 1
        with trio.fail_after(10):
            answer = b""
            while b'"choices"' not in answer:
                answer += await client.receive_some(65536)
        assert answer.startswith(b"HTTP/1.1 200") and orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
        await client.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert guard.in_flight == 0


@pytest.mark.parametrize("fails", [False, True], ids=["returns", "raises"])
async def test_our_worker_counts_a_request_from_its_spawn_to_its_end(gc_state: None, fails: bool) -> None:
    import trio
    import trio.testing
    from hypercorn.config import Config
    from hypercorn.utils import wrap_app

    from trioforward.server.front._appchannel import AppTaskGroup

    guard = _gc.BurstGC(high=1_000, low=0)
    _gc.install(guard)
    release = trio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()
        if fails:
            raise RuntimeError("the app failed")

    async def send(message: Any) -> None:
        pass

    async with AppTaskGroup(lambda s: s) as group:
        await group.spawn_app(wrap_app(app, 1 << 20, "asgi"), Config(), {"type": "http", "extensions": {}}, send)
        assert guard.in_flight == 1  # before the app's task has run at all
        await trio.testing.wait_all_tasks_blocked()
        assert guard.in_flight == 1
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert guard.in_flight == 0
