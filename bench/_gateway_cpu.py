"""Which processes a gateway under test is, and their CPU over one measurement window.

``trioforward serve --workers N`` is a supervisor and N worker processes (its
children); a single gateway is one process. The processes are read from
``/proc/PID/task/*/children`` at the start and at the end of each window (a
fleet member list from ``/health`` is one worker's view and lags a lease tick
behind a worker that just joined, so it may name one worker of two). Each
process is counted once, by role, so a reader of the JSON sees what was summed.
A worker replaced during the window cannot be accounted for (its CPU left with
it): :func:`cpu_by_role` raises.

CPU is user + system of the whole process, all threads (``/proc/PID/stat``
fields 14 and 15, in clock ticks: see proc(5)).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far, all threads; OSError once it exited."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (every thread's ``children`` file), sorted."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(child) for child in (task / "children").read_text().split())
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(found)


def command_name(pid: int) -> str:
    """``/proc/PID/comm`` (the executable's name, at most 15 characters)."""
    return Path(f"/proc/{pid}/comm").read_text().strip()


@dataclass(frozen=True)
class Roles:
    """The processes of one target by role: ``supervisor`` (None for a single
    gateway), ``workers`` (the serving processes: the one gateway, or each worker
    of ``--workers N``), ``valkey`` (the Valkey server the target uses, counted
    apart from the gateway; None when it uses none)."""

    supervisor: int | None
    workers: tuple[int, ...]
    valkey: int | None = None

    def pids(self) -> list[int]:
        listed = [p for p in (self.supervisor, *self.workers, self.valkey) if p is not None]
        if len(set(listed)) != len(listed):
            raise ValueError(f"a process has two roles: {self}")
        return listed


def gateway_roles(pid: int, workers: int, valkey: int | None) -> Roles:
    """The roles of the gateway started as process ``pid``: itself when ``workers``
    is 1, else the supervisor and its children (ValueError unless exactly
    ``workers`` of them are running)."""
    if workers == 1:
        return Roles(None, (pid,), valkey)
    running = tuple(children(pid))
    if len(running) != workers:
        raise ValueError(f"supervisor {pid} has {len(running)} children {running}, not {workers} workers")
    return Roles(pid, running, valkey)


def snapshot(roles: Roles) -> dict[int, float]:
    """CPU seconds so far of every process of ``roles``."""
    return {pid: process_cpu(pid) for pid in roles.pids()}


def cpu_by_role(roles: Roles, before: dict[int, float], after: dict[int, float]) -> dict[str, Any]:
    """CPU seconds each process of ``roles`` spent between two :func:`snapshot` s.

    Returns ``{"gateway": s, "supervisor": s | None, "workers": {pid: s},
    "valkey": s | None}``; ``gateway`` is the supervisor plus the workers (Valkey
    apart). Raises ValueError when a process of ``roles`` is missing from either
    snapshot (it was replaced or exited during the window) or a snapshot names a
    process that has no role.
    """
    pids = roles.pids()
    for name, snap in (("before", before), ("after", after)):
        if set(snap) != set(pids):
            raise ValueError(f"snapshot {name} has processes {sorted(snap)}, the roles {sorted(pids)}")
    spent = {pid: after[pid] - before[pid] for pid in pids}
    workers = {pid: spent[pid] for pid in roles.workers}
    supervisor = spent[roles.supervisor] if roles.supervisor is not None else None
    return {
        "gateway": sum(workers.values()) + (supervisor or 0.0),
        "supervisor": supervisor,
        "workers": workers,
        "valkey": spent[roles.valkey] if roles.valkey is not None else None,
    }


def valkey_pid(parent: int) -> int:
    """The one ``valkey-server`` child of ``parent`` (the bench's own); ValueError otherwise."""
    found = [p for p in children(parent) if command_name(p).startswith("valkey")]
    if len(found) != 1:
        raise ValueError(f"expected one valkey-server child of {parent}, found {found}")
    return found[0]


def responses_sent(worker: int) -> int | None:
    """Responses worker ``worker`` of ``--workers N`` has sent so far (its
    ``trioforward_gateway_requests`` counter, every route and status, read from
    its own prometheus-client multiprocess file ``counter_<pid>.db`` in the
    directory its environment names); None for a process without one (a single
    gateway)."""
    from prometheus_client.multiprocess import MultiProcessCollector

    environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    prefix = b"PROMETHEUS_MULTIPROC_DIR="
    directory = next((e[len(prefix):].decode() for e in environ if e.startswith(prefix)), None)
    if directory is None:
        return None
    path = Path(directory) / f"counter_{worker}.db"
    if not path.exists():
        return 0
    total = 0.0
    for metric in MultiProcessCollector.merge([str(path)], accumulate=True):  # type: ignore[no-untyped-call]
        if metric.name == "trioforward_gateway_requests":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return int(total)
