"""bench/_gateway_cpu.py: which processes bench/fleet.py counts for a target, and
their CPU over one window, each process once and by role (a gateway under
``--workers 2`` is the supervisor and both of its children; Valkey apart)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]

import _gateway_cpu as gcpu  # noqa: E402

# A stand-in supervisor: starts two children, prints their pids, waits for stdin's
# end; the children wait for theirs (the parent's pipes close when it exits).
SUPERVISOR = (
    "import subprocess, sys\n"
    "cmd = [sys.executable, '-c', 'import sys; sys.stdin.read()']\n"
    "kids = [subprocess.Popen(cmd, stdin=subprocess.PIPE) for _ in range(2)]\n"
    "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
    "sys.stdin.read()\n"
    "for k in kids:\n"
    "    k.stdin.close()\n"
    "    k.wait()\n"
)


def test_the_gateway_is_the_supervisor_plus_each_worker_and_valkey_apart() -> None:
    roles = gcpu.Roles(supervisor=10, workers=(11, 12), valkey=20)
    before = {10: 1.0, 11: 5.0, 12: 7.0, 20: 3.0}
    after = {10: 1.01, 11: 6.0, 12: 9.5, 20: 3.25}

    cpu = gcpu.cpu_by_role(roles, before, after)

    assert cpu["workers"] == pytest.approx({11: 1.0, 12: 2.5})
    assert cpu["supervisor"] == pytest.approx(0.01)
    assert cpu["gateway"] == pytest.approx(0.01 + 1.0 + 2.5)  # each process once, Valkey not in it
    assert cpu["valkey"] == pytest.approx(0.25)


def test_a_single_gateway_without_valkey_is_its_one_process() -> None:
    roles = gcpu.Roles(supervisor=None, workers=(30,))
    cpu = gcpu.cpu_by_role(roles, {30: 2.0}, {30: 2.5})
    assert cpu == {"gateway": pytest.approx(0.5), "supervisor": None, "workers": {30: pytest.approx(0.5)},
                   "valkey": None}


def test_a_worker_replaced_during_the_window_is_refused_not_dropped() -> None:
    roles = gcpu.Roles(supervisor=10, workers=(11, 12))
    with pytest.raises(ValueError, match="snapshot after"):
        gcpu.cpu_by_role(roles, {10: 0.0, 11: 0.0, 12: 0.0}, {10: 0.0, 11: 1.0, 13: 0.5})


def test_a_process_in_two_roles_is_refused() -> None:
    with pytest.raises(ValueError, match="two roles"):
        gcpu.Roles(supervisor=10, workers=(11, 11)).pids()


def test_both_children_of_a_supervisor_are_its_workers() -> None:
    parent = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        kids = sorted(int(pid) for pid in parent.stdout.readline().split())

        roles = gcpu.gateway_roles(parent.pid, 2, None)

        assert roles == gcpu.Roles(parent.pid, tuple(kids), None)
        assert set(gcpu.snapshot(roles)) == {parent.pid, *kids}
        with pytest.raises(ValueError, match="2 children"):
            gcpu.gateway_roles(parent.pid, 3, None)
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        assert parent.wait(timeout=30) == 0
        assert parent.stdout is not None
        parent.stdout.close()
