"""Weight-update gating on the client: ``pause``, ``resume``, ``paused`` and
``weight_version`` (docs/dispatch.md, "Pause and resume (weight updates)";
docs/operations.md, "What a pause does").

:class:`PauseGate` is a base of :class:`~trioforward.dispatch.Client`: it holds
the public pause/resume facade, and hands the work to the client's
``WeightUpdates`` (``_weights.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Literal

import trio

from trioforward.dispatch.attempts._dispatch import Dispatcher
from trioforward.dispatch.engines._engines import Engine, Registry
from trioforward.dispatch.rollout._weights import WeightUpdates

__all__ = ["EngineMode", "PauseGate", "PauseMode"]

PauseMode = Literal["wait", "abort"]
EngineMode = Literal["keep", "retract", "wait", "abort"]


class PauseGate:
    """The pause/resume part of :class:`~trioforward.dispatch.Client` (set up by its ``__init__``)."""

    _registry: Registry
    _dispatcher: Dispatcher
    _paused_all: bool
    weights: WeightUpdates

    def _targets(self, engines: Iterable[str] | None) -> list[Engine]:
        if engines is None:
            return list(self._registry.engines)
        return [self._registry.get(url) for url in _urls(engines)]

    async def pause(
        self,
        engines: Iterable[str] | None = None,
        mode: PauseMode = "wait",
        *,
        engine_mode: EngineMode | None = None,
        replay: bool | str = False,
        call_engines: bool = True,
    ) -> None:
        """Stop new dispatch to ``engines`` (default: all, including ones added later),
        and with ``engine_mode`` pause the engines themselves (docs/operations.md).

        Requests keep arriving and wait in QUEUED, with no budget charged. Gate
        only (no ``engine_mode``): ``mode="wait"`` returns once the in-flight
        requests there finished; ``"abort"`` closes them and returns. With
        ``engine_mode`` (``"keep"``, ``"retract"``, ``"wait"``, ``"abort"``) every
        engine is paused too, at once, all or nothing. ``replay=True`` (or
        ``"whole"``): requests a pause aborted run again, whole, after
        :meth:`resume`; ``replay="continue"``: a completion an engine pause ended
        after it generated tokens is continued from them after :meth:`resume`
        (prompt + tokens so far, the budget left), its answer joined into one with
        per-choice ``weight_versions`` (docs/operations.md, "Continue after an
        abort pause"); otherwise each caller gets :class:`DispatchAborted`. ``call_engines=False``: gate and
        prepare here only (a fleet member; one member pauses the engines).

        Raises ``KeyError`` for an unknown engine, ``ValueError`` for a bad
        mode, :class:`~trioforward.dispatch.EngineControlError` (naming the
        engine) when an engine fails to pause — the others, and any whose
        answer never came, are then resumed — and
        :class:`~trioforward.errors.PauseOvertaken` when a :meth:`resume`
        arrived while it was in progress. A pause behind another waits for it.
        """
        if mode not in ("wait", "abort"):
            raise ValueError(f"pause mode must be 'wait' or 'abort', got {mode!r}")
        targets = self._targets(engines)
        # One control call at a time, in arrival order: a pause behind another
        # waits for it (docs/operations.md, "Overlapping control calls").
        async with self.weights.order:
            was_all = self._paused_all
            if engines is None:
                self._paused_all = True
            try:
                await self.weights.pause(targets, mode, engine_mode, replay, call_engines)
            except BaseException:
                self._paused_all = was_all
                raise

    async def resume(
        self,
        engines: Iterable[str] | None = None,
        *,
        weight_version: str | None = None,
        call_engines: bool = True,
    ) -> None:
        """Resume the engines paused with an ``engine_mode`` (telling them
        ``weight_version``), record ``weight_version`` (every later answer carries
        it), then let dispatch start again; waiting requests go in FIFO order.
        A pause still in progress on any of ``engines`` is overtaken first (it
        raises :class:`~trioforward.errors.PauseOvertaken`); the engines it reached
        are resumed here. ``call_engines=False``: the gate only (a fleet member;
        the member that took the resume resumes the engines once). Raises
        ``ValueError`` for a bad version,
        :class:`EngineControlError` for an engine that failed to resume (it stays
        paused; the others are resumed).
        """
        targets = self._targets(engines)
        # A pause still draining or waiting for an engine's answer is cut short
        # (it raises PauseOvertaken); its engines are resumed here, after it ended,
        # so nothing it does afterwards leaves an engine paused behind an open gate.
        self.weights.overtake(targets)
        async with self.weights.order:
            if engines is None:
                self._paused_all = False
            await self.weights.resume(targets, weight_version, call_engines)
        await trio.lowlevel.checkpoint()

    @property
    def weight_version(self) -> str | None:
        """The weight version recorded by the last ``resume(weight_version=...)``."""
        return self._dispatcher.weight_version

    @asynccontextmanager
    async def paused(
        self, engines: Iterable[str] | None = None, mode: PauseMode = "wait"
    ) -> AsyncIterator[None]:
        """``async with client.paused():`` — pause on entry, resume on exit (even on error)."""
        targets = None if engines is None else _urls(engines)
        await self.pause(targets, mode)
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                await self.resume(targets)


def _urls(engines: Iterable[str]) -> list[str]:
    """Engine URLs; one string is one URL or a comma-separated list (as
    ``TRIOFORWARD_ENGINES``), never its characters."""
    if isinstance(engines, str):
        return [url.strip() for url in engines.split(",") if url.strip()]
    return list(engines)
