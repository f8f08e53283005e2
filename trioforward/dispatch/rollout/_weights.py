"""Weight updates as one operation: gate dispatch, pause the engines, replay, version.

``client.pause(engine_mode=..., replay=...)`` and ``client.resume(weight_version=...)``
(docs/operations.md). A pause first closes the dispatch gate (new requests wait
in QUEUED, no budget charged), then pauses every target engine at once on the
control pool (:mod:`._engine_control`), all-or-nothing: if one engine fails,
those already paused are resumed, the gate is opened again and the call raises
:class:`EngineControlError` naming the engine. Engine modes:

- ``"keep"`` (SGLang ``in_place``; ``"retract"``: SGLang ``retract``, vLLM
  ``keep``): the engine freezes the requests it runs; they stay dispatched and
  their dispatch deadline is extended by the time the engine was paused (the
  deadline measures the engine working on the request). Their answers mix the
  old and the new weights, and say so (both versions). Returns at once.
- ``"wait"``: returns once the engine's requests have finished (old weights).
- ``"abort"``: the engine ends its requests; streams whose head already went to
  the caller are ended by the gateway first (an error event, never the engine's
  truncated ``finish_reason: "abort"`` stream); whatever is still open once the
  engine's pause answered is closed by the gateway (vLLM 0.32 holds a request that
  reached it after the pause and runs it after resume: docs/operations.md). With
  ``replay=True`` every such request goes back to QUEUED and runs again, whole,
  after the resume; otherwise its caller gets :class:`DispatchAborted`. Returns
  once none is left on the engine.

Nothing here is on the request path: the per-request cost is a few attribute
reads in :class:`Client` (``req.replay``) and one store at dispatch
(``req.weight_version``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio

from trioforward.dispatch.attempts._dispatch import Dispatcher
from trioforward.dispatch.engines._engines import Engine, Registry
from trioforward.dispatch.rollout._continue import CONTINUE, replay_mode
from trioforward.dispatch.rollout._engine_control import (
    ENGINE_MODES,
    EngineControl,
    EngineControlError,
)
from trioforward.dispatch.rollout._pause_args import bad_version_reason, pause_conflict
from trioforward.dispatch.rollout._staleness import VersionOrder
from trioforward.errors import PauseOvertaken

__all__ = ["WeightUpdates", "EnginePause"]

log = logging.getLogger("trioforward.dispatch")

@dataclass(slots=True)
class EnginePause:
    """An engine paused at the engine level: its kind, mode and when (trio clock)."""

    kind: str
    mode: str
    since: float


class WeightUpdates:
    """Engine-level pause state and the weight version of one client."""

    def __init__(self, registry: Registry, dispatcher: Dispatcher, control: EngineControl) -> None:
        self._registry = registry
        self._dispatcher = dispatcher
        self.control = control
        self.versions: Any = None  # the client's VersionGate (_versions.py)
        #: The versions in the order they were resumed (_staleness.py).
        self.version_order = VersionOrder()
        # Engine URL -> its pause, recorded *before* the engine is asked: an engine
        # whose pause answer never came may be paused, and every resume (and the
        # rollback of a failed pause) resumes what is recorded here.
        self.engine_pauses: dict[str, EnginePause] = {}
        #: Pause and resume calls run one at a time, in arrival order (trio's Lock
        #: is FIFO); a resume first overtakes a pause still in progress
        #: (:meth:`overtake`). docs/operations.md, "Overlapping control calls".
        self.order = trio.Lock()
        self._running: tuple[trio.CancelScope, set[str]] | None = None

    def targets(self, urls: list[str] | None) -> list[Engine]:
        """The registered engines named by ``urls`` (all if ``None``); ``KeyError`` if unknown."""
        if urls is None:
            return list(self._registry.engines)
        return [self._registry.get(url) for url in urls]

    @property
    def version(self) -> str | None:
        """The weight version recorded by the last ``resume(weight_version=...)``."""
        return self._dispatcher.weight_version

    # -- pause ---------------------------------------------------------------------

    def overtake(self, targets: list[Engine]) -> None:
        """Cut short the pause in progress if it touches ``targets`` (a resume is
        coming): its drain and its engine calls are cancelled, it raises
        :class:`PauseOvertaken` and leaves the gate and the engines it reached
        (recorded in :attr:`engine_pauses`) to the resume."""
        if self._running is not None:
            scope, urls = self._running
            if urls & {e.url for e in targets}:
                scope.cancel()

    async def pause(
        self,
        targets: list[Engine],
        mode: str,
        engine_mode: str | None,
        replay: bool | str | None,
        call_engines: bool = True,
    ) -> None:
        """Gate ``targets``, then pause them at ``engine_mode`` (None: gate only, as
        ``mode`` says). ``replay``: ``False``/``None``, ``True``/``"whole"``, or
        ``"continue"`` (docs/operations.md). ``call_engines=False``: this process's
        part only (a fleet member; another member pauses the engines once:
        :meth:`pause_engines`). Raises ``ValueError`` for a bad mode or replay,
        :class:`EngineControlError`, :class:`PauseOvertaken` when a resume cut it
        short (:meth:`overtake`). The caller holds :attr:`order`."""
        scope = trio.CancelScope()
        self._running = (scope, {e.url for e in targets})
        try:
            with scope:
                await self._pause(targets, mode, engine_mode, replay, call_engines, scope)
        finally:
            self._running = None
        if scope.cancelled_caught:
            raise PauseOvertaken(
                "the pause was overtaken by a resume while in progress: the engines it"
                " had reached are resumed with it",
                engine=targets[0].url if targets else None,
            )

    async def _pause(
        self,
        targets: list[Engine],
        mode: str,
        engine_mode: str | None,
        replay: bool | str | None,
        call_engines: bool,
        scope: trio.CancelScope,
    ) -> None:
        if engine_mode is not None and engine_mode not in ENGINE_MODES:
            raise ValueError(
                f"engine_mode must be one of {', '.join(ENGINE_MODES)}, got {engine_mode!r}"
            )
        how = replay_mode(replay)
        conflict = pause_conflict(mode, engine_mode, how)
        if conflict is not None:
            raise ValueError(conflict[0])
        gated = [e for e in targets if not e.paused]
        for engine in gated:
            self._registry.set_paused(engine, True)
        if engine_mode is None:
            if mode == "abort":
                self._abort(targets, how, "mode=abort")
            await _wait_idle(targets)
            return
        if engine_mode == "abort" and how == CONTINUE:
            # Every request, streams included, waits for the engine's abort answer:
            # its tokens so far are what the continuation starts from.
            for engine in targets:
                for req in engine.calls:
                    req.replay = CONTINUE
            if not call_engines:
                return  # a fleet member: the engines' abort answers end its requests
        elif engine_mode == "abort" and call_engines:
            # A stream whose head went out cannot be replayed: end it ourselves,
            # before the engine sends a truncated "finish_reason: abort" stream.
            self._abort(targets, how, "engine_mode=abort", streams_only=True)
            for engine in targets:
                for req in engine.calls:
                    req.replay = how is not None
        if call_engines:
            try:
                await self.pause_engines(targets, engine_mode)
            except BaseException:
                if not scope.cancel_called:  # overtaken: the resume opens the gate
                    for engine in gated:
                        # One whose pause outcome is still unknown (its rollback
                        # resume failed too) stays gated until a resume.
                        if engine.url not in self.engine_pauses:
                            self._registry.set_paused(engine, False)
                raise
        now = trio.current_time()
        if engine_mode in ("keep", "retract"):
            for engine in targets:
                for req in engine.calls:
                    req.frozen_since = now
        elif engine_mode == "abort":
            if how == CONTINUE:
                # The engine's abort answers are on their way: read them (their
                # tokens are kept) before closing what it still holds.
                # (``abort_answer_grace``, docs/configuration.md).
                with trio.move_on_after(self._dispatcher.settings.abort_answer_grace):
                    await _wait_idle(targets)
            for engine in targets:
                if engine.calls and call_engines:
                    # vLLM 0.32 holds a request that reached it after the pause and
                    # runs it after /resume (docs/operations.md, "What vLLM 0.32
                    # does under an abort pause").
                    log.info(
                        "engine %s: %d request(s) still open after its abort pause"
                        " (not ended by the engine, or its answer not read yet): closed%s",
                        engine.url,
                        len(engine.calls),
                        {None: "", "whole": ", replayed after resume"}.get(
                            how, ", replayed or continued after resume"
                        ),
                    )
            self._abort(targets, how, "engine_mode=abort")
        if engine_mode != "keep" and engine_mode != "retract":
            await _wait_idle(targets)

    async def pause_engines(self, targets: list[Engine], mode: str) -> None:
        """Pause the engines themselves, at once, all or nothing: the engines that
        did pause, and those whose answer never came (their pause may have taken
        effect), are resumed, then :class:`EngineControlError` names the failure.
        Each is recorded in :attr:`engine_pauses` before it is asked, so a resume
        arriving meanwhile resumes it too. An engine that cannot be resumed then
        stays recorded (and, through :meth:`pause`, gated) until a resume."""
        done: list[Engine] = []
        failed: list[tuple[Engine, BaseException]] = []
        unknown: list[Engine] = []

        async def one(engine: Engine) -> None:
            before = self.engine_pauses.get(engine.url)
            try:
                kind = await self.control.kind(engine.url)
                if kind == "sglang" and mode == "wait":
                    await engine.wait_idle()  # SGLang has no wait mode: drain ours first
                if kind != "none":  # an engine without pause endpoints: paused at the gateway only
                    self.engine_pauses[engine.url] = EnginePause(kind, mode, trio.current_time())
                await self.control.pause(engine.url, kind, mode)
            except EngineControlError as exc:
                failed.append((engine, exc))
                if not exc.answered and engine.url in self.engine_pauses:
                    unknown.append(engine)
                elif before is not None:  # it refused: as it was before this call
                    self.engine_pauses[engine.url] = before
                else:
                    self.engine_pauses.pop(engine.url, None)
            else:
                done.append(engine)

        async with trio.open_nursery() as nursery:
            for engine in targets:
                nursery.start_soon(one, engine)
        if failed:
            # All or nothing: the engines that did (or may have) paused go back to work.
            with trio.CancelScope(shield=True):
                back = [e for e in done + unknown if e.url in self.engine_pauses]
                stuck = await self._resume_engines(back, None)
            names = ", ".join(e.url for e, _ in failed)
            held = (
                "; still paused (their resume failed too), gated until a resume: "
                + ", ".join(e.url for e in stuck)
                if stuck
                else ""
            )
            raise EngineControlError(
                f"engine pause failed on {names} (the other engines, and any whose answer"
                " never came, were resumed): "
                + "; ".join(str(exc) for _, exc in failed)
                + held,
                engine=failed[0][0].url,
            ) from failed[0][1]

    def _abort(
        self, targets: list[Engine], how: str | None, why: str, streams_only: bool = False
    ) -> None:
        for engine in targets:
            for req in list(engine.calls):
                if streams_only and not req.streaming:
                    continue
                if how == CONTINUE:
                    req.replay = CONTINUE
                else:
                    req.replay = how is not None and not req.handed_over
                req.abort(f"engine {engine.url} was paused ({why}) for a weight update")

    # -- resume ------------------------------------------------------------------

    async def resume(
        self, targets: list[Engine], weight_version: str | None, call_engines: bool = True
    ) -> None:
        """Resume the engines paused at the engine level among ``targets`` (and tell
        them ``weight_version``), record the version, then open the gate. An engine
        that fails stays paused; raises :class:`EngineControlError` naming it.
        ``call_engines=False``: a fleet member's part, the gate only; the member
        that took the resume resumes the engines (:meth:`resume_engines`), so this
        one forgets its own records of them."""
        reason = None if weight_version is None else bad_version_reason(weight_version)
        if reason is not None:
            raise ValueError(f"weight_version {reason}")
        paused = [e for e in targets if e.url in self.engine_pauses]
        if not call_engines:
            for engine in paused:
                del self.engine_pauses[engine.url]
            paused = []
        failed = await self._resume_engines(paused, weight_version)
        now = trio.current_time()
        for engine in targets:
            if weight_version is not None and engine not in failed and engine.held_out is None:
                # What it runs now (_staleness.py). One held out until it reports a
                # version was not told this one (unless resumed at the engine
                # level: VersionGate.resumed below), so it is not assumed to run it.
                engine.reported_version = weight_version
            for req in engine.calls:
                if req.frozen_since is not None:
                    req.frozen_time += now - req.frozen_since
                    req.frozen_since = None
            if engine not in failed:
                if engine in paused and self.versions is not None:
                    self.versions.resumed(engine, weight_version)
                self._registry.set_paused(engine, False)
        if weight_version is not None:
            self.record_version(weight_version)
        if self.versions is not None and weight_version is not None:
            self.versions.recheck()
            # An engine whose resume failed may still run the old weights: held
            # out until it reports the new version (docs/operations.md, "One
            # weight version across the engines"), not paused.
            for engine in failed:
                self.versions.hold(engine, f"its resume failed ({failed[engine]})")
                self._registry.set_paused(engine, False)
        if failed:
            held = self.versions is not None and weight_version is not None
            raise EngineControlError(
                "engine resume failed on "
                + ", ".join(f"{e.url} ({exc})" for e, exc in failed.items())
                + ("; they are held out until they report the version" if held else "; they stay paused"),
                engine=next(iter(failed)).url,
            )

    async def resume_engines(self, targets: list[Engine], version: str | None) -> None:
        """Resume every one of ``targets`` that has pause endpoints, whoever paused it
        (a fleet member resumes engines another member paused), telling it
        ``version``; raises :class:`EngineControlError` naming the failures."""
        for engine in targets:
            if engine.url not in self.engine_pauses:
                kind = await self.control.kind(engine.url)
                self.engine_pauses[engine.url] = EnginePause(kind, "?", trio.current_time())
        failed = await self._resume_engines(targets, version)
        if failed:
            raise EngineControlError(
                "engine resume failed on "
                + ", ".join(f"{e.url} ({exc})" for e, exc in failed.items()),
                engine=next(iter(failed)).url,
            )

    def record_version(self, version: str) -> None:
        """Record the weight version every later dispatch is stamped with (the
        current one of :attr:`order`)."""
        self._dispatcher.weight_version = version
        self.version_order.record(version)

    async def _resume_engines(
        self, engines: list[Engine], version: str | None
    ) -> dict[Engine, BaseException]:
        failed: dict[Engine, BaseException] = {}

        async def one(engine: Engine) -> None:
            pause = self.engine_pauses[engine.url]
            try:
                if version is not None:
                    await self.control.set_version(engine.url, pause.kind, version)
                await self.control.resume(engine.url, pause.kind)
            except EngineControlError as exc:
                failed[engine] = exc
                log.warning("engine %s: resume failed: %s", engine.url, exc)
            else:
                del self.engine_pauses[engine.url]

        async with trio.open_nursery() as nursery:
            for engine in engines:
                nursery.start_soon(one, engine)
        return failed


async def _wait_idle(targets: list[Engine]) -> None:
    for engine in targets:
        await engine.wait_idle()
