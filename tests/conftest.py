"""Shared fixtures: every test that touches sockets checks that no file descriptor leaks."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

from trioforward import _h11

# The suite's gateways run in this process: Hypercorn (imported by the tests and
# the server package) gets the h11 trioforward chose, as under `trioforward serve`.
# `nox -s tests_pure_h11` runs the suite again with TRIOFORWARD_H11=pure.
_h11.use_for_front()


def open_fds() -> int:
    """How many file descriptors this process holds (Linux: /proc/self/fd)."""
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def fd_baseline() -> Iterator[int]:
    """Yields the fd count before the test; fails the test if it grew by the end."""
    gc.collect()
    before = open_fds()
    yield before
    gc.collect()
    after = open_fds()
    assert after <= before, f"file descriptors leaked: {before} before, {after} after"


# tests/real_engine/ needs a live vLLM and its own virtualenv: `nox -s real_engine`
# (docs/compatibility.md) sets TRIOFORWARD_REAL_ENGINE=1; the ordinary run skips it.
collect_ignore = [] if os.environ.get("TRIOFORWARD_REAL_ENGINE") else ["real_engine"]
# tests/clients/ needs the RL clients' own virtualenv: `nox -s clients` (docs/compatibility.md).
if not os.environ.get("TRIOFORWARD_CLIENTS"):
    collect_ignore.append("clients")
