"""The simulated engine's timing model: prefill and decode time, and prefill
stalls (docs/sim.md, "Engine model"; docs/sim.md, "Speed (instant mode)").

:class:`TimingModel` is a base of :class:`~trioforward.sim.SimEngine`: it holds
:meth:`~TimingModel.prefill_stall`, :meth:`~TimingModel.end_stall`, the
``instant`` test, the wait for a capacity slot (``_take_slot``) and the sleeps a
timed generation makes (``_prefill``, ``_decode``).
"""

from __future__ import annotations

import math

import trio

from trioforward.sim.core._rl import RLControl
from trioforward.sim.core._stats import EngineStats
from trioforward.sim.model._api import Generation
from trioforward.sim.physics._prefix_cache import PrefixCache, prefill_tokens
from trioforward.sim.physics._scheduler import Scheduler

__all__ = ["TimingModel"]


class TimingModel:
    """The timing part of :class:`~trioforward.sim.SimEngine` (set up by its ``__init__``)."""

    prefill_ms_per_token: float
    decode_ms_per_token: float
    prefix_cache: PrefixCache | None
    scheduler: Scheduler | None
    stats: EngineStats
    rl: RLControl
    _stall_until: float
    _stall_slowdown: float
    _stall_changed: trio.Event
    _limiter: trio.CapacityLimiter

    @property
    def instant(self) -> bool:
        """True when generation takes no time at all (no sleep, no queue)."""
        return (
            self.scheduler is None
            and self.prefill_ms_per_token <= 0
            and self.decode_ms_per_token <= 0
            and trio.current_time() >= self._stall_until
            and not self.rl.paused
        )

    def prefill_stall(self, seconds: float, slowdown: float = math.inf) -> None:
        """Slow every running decode by ``slowdown`` (inf = halt) for ``seconds`` (inf = until ended)."""
        self._stall_until = trio.current_time() + seconds
        self._stall_slowdown = max(1.0, slowdown)
        self._wake_decoders()

    def _stall_factor(self) -> tuple[float, float]:
        """The slowdown a prefill stall puts on a step now (1.0 = none, inf = halt) and its end."""
        if trio.current_time() < self._stall_until:
            return self._stall_slowdown, self._stall_until
        return 1.0, -math.inf

    def end_stall(self) -> None:
        """End a prefill stall now."""
        self._stall_until = -math.inf
        self._wake_decoders()

    async def _take_slot(self) -> None:
        """Take one of the ``capacity`` slots (FIFO), counted in ``stats.queued``
        while it waits; the caller releases ``_limiter`` when the request ends."""
        stats = self.stats
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            stats.queued += 1
            stats.peak_queued = max(stats.peak_queued, stats.queued)
            stats.changed()
            try:
                await self._limiter.acquire()
            finally:
                stats.queued -= 1
                stats.changed()

    def _wake_decoders(self) -> None:
        self._stall_changed.set()
        self._stall_changed = trio.Event()

    async def _decode(self, steps: int) -> None:
        # Progress is integrated over time: a stall starting or ending wakes
        # every decoder, which re-plans at the new rate (one sleep per change,
        # not one per token).
        remaining = steps * self.decode_ms_per_token / 1000.0
        while True:
            now = trio.current_time()
            rate, horizon = 1.0, math.inf
            if now < self._stall_until:
                rate, horizon = 1.0 / self._stall_slowdown, self._stall_until - now
            if self.rl.frozen:  # a keep / in_place / retract pause: no progress until resume
                rate, horizon = 0.0, math.inf
            if remaining <= 0 and rate > 0:
                return
            need = remaining / rate if rate > 0 else math.inf
            changed = self._stall_changed
            with trio.move_on_after(min(need, horizon)):
                await changed.wait()
            if not changed.is_set() and need <= horizon:
                return
            remaining -= (trio.current_time() - now) * rate

    async def _prefill(self, gen: Generation) -> None:
        seconds = self.prefill_ms_per_token * prefill_tokens(self.prefix_cache, self.stats, gen) / 1000.0
        if seconds > 0:
            await trio.sleep(seconds)
