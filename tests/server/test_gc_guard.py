"""BurstGC: pauses automatic collection while many data-plane requests are in flight."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from trioforward.server import _gc
from trioforward.server._serve import tune_gc


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
