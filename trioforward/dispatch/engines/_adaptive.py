"""Capacity from the engine: how many requests the gateway lets run on an engine,
learnt from its own load reports (``adaptive_capacity``; docs/dispatch.md,
"Capacity from the engine").

:class:`AdaptiveLimit` is the rule, a pure function of the reports it is fed
(no clock, no I/O), one per engine. Per report (``running``, ``waiting``,
``kv_usage``, the preemption counter):

1. **Preempted since the last report, or more waiting than a small slack in
   two reports in a row** (the engine holds sequences it does not run: its
   ``max_num_seqs`` or its KV cache binds, and it recomputes what it had to
   evict): the limit becomes what runs plus the slack (``max(2, running /
   8)``), and slow start ends. The engine keeps the next sequences at hand
   for its next step (its own admission, which knows its free blocks, picks
   the moment); more would only wait *inside* the engine, where the gateway
   can no longer hand them to an engine that frees a slot, nor a session to
   another engine.
2. **Else any waiting, or KV use at or above** ``kv_high`` (0.95): hold.
3. **Else, when the limit binds** (requests wait for it at the gateway, or all
   of it is in use): grow — doubling while in slow start, then +1 a report
   (additive increase).

Always ``1 <= limit <= bound`` (``engine_capacity``; ``math.inf`` when 0).
Why this rule: in a step-based engine (vLLM, SGLang; the simulated one:
docs/sim.md, "Engine model") a step's cost grows linearly with the batch
while its tokens grow with the batch, so tokens/s rises with the batch until
the KV cache binds. Where it binds the engine's own admission is the better
judge (it sees its free blocks every step, the gateway one report late), and a
preempted sequence's full blocks stay in its prefix cache, so a recompute is
mostly cache hits: on the benchmark (docs/performance.md, "Capacity from the engine: static vs adaptive")
a gateway that held each engine below its KV budget (a multiplicative cut
on every preemption, growth capped by a KV projection) ran the busiest
engine longer than the static ``max_num_seqs`` did. So the rule keeps the
engine's queue short rather than its KV below a mark: what the gateway holds
back it can still place.

``saturated`` (read by session routing) is set by a report with preemptions
or waiting beyond the slack (rule 1) and cleared after :data:`CALM_REPORTS` reports with
neither: a session does not flap on one noisy report.
"""

from __future__ import annotations

import logging
import math

import trio

from trioforward.dispatch.engines._engines import Engine
from trioforward.dispatch.engines._load import LOAD_PATH, LoadReport, read_load
from trioforward.http import ConnectionPool

__all__ = ["AdaptiveLimit", "CALM_REPORTS", "START", "KV_HIGH", "load_loop"]

log = logging.getLogger("trioforward.dispatch")

#: The limit an engine starts with (at most its bound).
START = 8
#: KV usage above which the limit stops growing.
KV_HIGH = 0.95
#: Reports without preemption or waiting that clear ``saturated``.
CALM_REPORTS = 3


class AdaptiveLimit:
    """The learnt limit of one engine; ``bound``: ``engine_capacity`` (inf = none)."""

    __slots__ = ("bound", "limit", "slow_start", "saturated", "kv_high", "_calm", "_waited", "_preemptions")

    def __init__(self, bound: float, *, kv_high: float = KV_HIGH) -> None:
        self.bound = bound
        self.kv_high = kv_high
        self.restart()

    def restart(self) -> None:
        """Start over at :data:`START` (the reports came back after a gap)."""
        self.limit = int(min(self.bound, START))
        self.slow_start = True
        self.saturated = False
        self._calm = 0
        self._waited = False  # the last report had waiting sequences
        self._preemptions: float | None = None

    def observe(self, report: LoadReport, *, binding: bool) -> int:
        """Feed one report; returns the new limit. ``binding``: the limit was
        reached since the last report (requests waited for it at the gateway,
        or every slot of it was in use)."""
        preempted = self._preempted(report.preemptions)
        # Waiting in two reports in a row: one alone may be a request that
        # arrived since the engine's last step and is admitted at the next.
        slack = max(2, math.ceil(report.running / 8))
        waiting = report.waiting > slack and self._waited
        self._waited = report.waiting > slack
        limit = self.limit
        if preempted or waiting:
            limit = min(limit, report.running + slack)
            self.slow_start = False
        elif report.waiting > 0 or (report.kv_usage is not None and report.kv_usage >= self.kv_high):
            pass
        elif binding:
            limit = limit * 2 if self.slow_start else limit + 1
        self.limit = int(min(self.bound, max(1, limit)))
        if preempted or waiting:
            self.saturated, self._calm = True, 0
        elif self.saturated:
            self._calm += 1
            if self._calm >= CALM_REPORTS:
                self.saturated = False
        return self.limit

    def _preempted(self, total: float | None) -> bool:
        last, self._preemptions = self._preemptions, total
        # A counter that went back is an engine that restarted: a new baseline.
        return total is not None and last is not None and total > last


#: Reports missing or garbage in a row before the engine is back on its static bound.
FAILURES = 2
#: Reports in a row claiming an idle engine while the gateway has requests on
#: it before the reports are taken for stale.
STALE_REPORTS = 20


async def load_loop(
    pool: ConnectionPool, engine: Engine, *, interval: float, wait_s: float, adapt: bool = True
) -> None:
    """Read ``engine``'s load report every ``interval`` seconds (each within
    ``wait_s``) on ``pool`` (the control pool) and set its learnt limit, until
    it is removed. An engine of kind ``openai`` keeps its static bound. Reports
    that vanish (no answer, non-200), are garbage, or stay stale (an idle
    engine reported for :data:`STALE_REPORTS` reports while requests run on
    it) put it back on its static bound, logged once; good reports resume
    the adaptation from :data:`START`. ``adapt`` False: only ``reported`` and
    ``saturated`` are kept (routing reads them), the limit stays static."""
    await engine.kind_known.wait()
    kind = engine.kind
    if kind not in LOAD_PATH:
        log.info("engine %s (%s) reports no load: its capacity stays %s", engine.url, kind, engine.capacity)
        return
    control = AdaptiveLimit(engine.capacity if engine.capacity > 0 else math.inf)
    if adapt:
        engine.set_limit(control.limit)
    failures = stale = 0
    warned = False
    while not engine.removed:
        await trio.sleep(interval)
        report = await read_load(pool, engine.url, kind, wait_s)
        if engine.removed:
            return
        if report is not None and report.busy == 0 and engine.in_flight > 0:
            stale += 1
        else:
            stale = 0
        if report is None or stale >= STALE_REPORTS:
            failures += 1
            if failures == FAILURES:
                engine.reported, engine.saturated = 0, False
                engine.set_limit(None)
                if not warned:
                    warned = True
                    why = "stale" if report is not None else f"missing or garbage at {LOAD_PATH[kind]}"
                    log.warning(
                        "engine %s: load reports %s; back to its static capacity %s",
                        engine.url, why, engine.capacity or "unlimited",
                    )
            continue
        if failures >= FAILURES:
            log.info("engine %s: load reports usable again", engine.url)
            control.restart()
        failures = 0
        binding = engine.queued > 0 or engine.in_flight >= control.limit
        limit = control.observe(report, binding=binding)
        if adapt:
            engine.set_limit(limit)
        engine.reported = report.busy
        engine.saturated = control.saturated
