"""Draining: when requests still QUEUED stop waiting (docs/server.md, "Shutdown";
docs/embedding.md, "Closing the client").

A drain has a cutoff (``trio.current_time()`` clock, s), set by
:meth:`Drain.begin`. From then on:

- a request that would wait for an engine while none can serve it (none
  eligible, none merely paused: every engine ejected or removed) raises
  :class:`ShuttingDown` at once — nothing the drain can wait for would bring an
  engine back in time, and the client can go elsewhere now;
- a request waiting for capacity, or for a paused engine, keeps its place: the
  requests ahead of it may well finish within the grace and let it run. It
  raises :class:`ShuttingDown` when the cutoff comes, if still QUEUED then;
- from the cutoff on, every request that reaches QUEUED raises at once.

Requests already dispatched are never touched here: they keep running.
``_queueing.acquire`` bounds each of its waits with :meth:`Drain.bounding`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from trioforward.dispatch.engines._engines import Registry
from trioforward.errors import ShuttingDown

__all__ = ["Drain"]


class Drain:
    """The drain state of one client: not draining until :meth:`begin`."""

    __slots__ = ("cutoff", "reason", "_registry", "_waits")

    def __init__(self, registry: Registry) -> None:
        self.cutoff = math.inf  # not draining
        self.reason = ""
        self._registry = registry
        # The cancel scope of each QUEUED wait -> whether it waits for an engine
        # (True) or for an engine's capacity (False).
        self._waits: dict[trio.CancelScope, bool] = {}

    @property
    def draining(self) -> bool:
        return self.cutoff < math.inf

    def begin(self, cutoff: float, reason: str) -> None:
        """Start draining with ``cutoff`` (an earlier cutoff than one already set
        wins; a later one is ignored). ``reason`` opens the error message."""
        if cutoff >= self.cutoff:
            return
        self.cutoff = cutoff
        self.reason = reason
        hopeless = self.hopeless()
        now = trio.current_time()
        for scope, for_engine in self._waits.items():
            scope.deadline = min(scope.deadline, now if for_engine and hopeless else cutoff)

    def hopeless(self) -> bool:
        """Whether a request waiting for an engine has nothing to wait for: no
        engine is merely paused (healthy, registered). O(engines)."""
        return not self._registry.any_healthy_paused()

    def over(self) -> bool:
        """Whether the cutoff has passed (the clock is read only while draining)."""
        return self.cutoff < math.inf and trio.current_time() >= self.cutoff

    @contextmanager
    def bounding(self, scope: trio.CancelScope, *, for_engine: bool) -> Iterator[None]:
        """Within the block, :meth:`begin` moves ``scope``'s deadline (a QUEUED
        wait) to the cutoff, or to now for an engine wait that is hopeless."""
        self._waits[scope] = for_engine
        try:
            yield
        finally:
            del self._waits[scope]

    def refusal(self) -> ShuttingDown:
        """The error of a request the drain ends (not yet stamped)."""
        return ShuttingDown(
            f"{self.reason}: the request was still queued and no engine ran it; send it again"
        )
