"""Staleness-bounded admission: rollouts never start further ahead of training than a
trainer accepts (docs/operations.md, "Staleness-bounded admission").

A trainer declares, for one tenant or one rollout-group family (the groups whose
id starts with a prefix), its ``step`` (rollouts it consumes per version) and
``eta`` (η: how many versions a rollout may lag the weights being trained).
From then on the gateway starts at most ``(i + η + 1) × step`` of that scope's
rollouts, ``i`` counting the versions resumed since the declaration (AReaL's
rule, "submitted ≤ (version + η + 1) × batch", counted by the gateway instead of
by each trainer). A rollout is one request that passes the gate; its replays and
continuations are the same rollout. The rest wait, in arrival order, before any
engine queue (no engine slot held, charged to no dispatch budget; their own
figure: ``Request.admission_time``, ``/metrics``, ``Server-Timing``) and start as
resumes move the bound. They are never refused; an abort call, the caller
hanging up or the client's drain end the wait.

A running rollout that falls more than η versions behind (it started, or was
last continued, under version ``j`` and the current one is past ``j + η``) is
handled as the trainer chose (``on_stale``):

- ``"continue"``: its engine ends it by its abort route (the answer keeps its
  tokens) and it continues on an engine of the current version, through the
  same continuation an abort pause with ``replay="continue"`` uses (its
  ``weight_versions`` spans name both versions);
- ``"abort"``: it is aborted as an abort call does, and answers with what it
  generated (``finish_reason: "abort"``).

Cost: a request of a scope with no declaration pays one dict lookup (two with
families declared); a declared one O(1) plus, while it waits, one deque entry.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import trio

from trioforward.dispatch.attempts._drain import Drain
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.engines._engines import Engine
from trioforward.dispatch.rollout._abort import engine_names
from trioforward.dispatch.rollout._continue import CONTINUE
from trioforward.dispatch.rollout._engine_control import EngineControl, EngineControlError
from trioforward.dispatch.rollout._staleness import LATEST, VersionOrder

__all__ = ["Admission", "StalenessBound", "SharedCount", "ON_STALE"]

log = logging.getLogger("trioforward.dispatch")

ON_STALE = ("continue", "abort")


@dataclass(frozen=True, slots=True)
class StalenessBound:
    """One declaration: ``step`` rollouts per version (>= 1), ``eta`` versions of
    staleness accepted (>= 0), what happens to a rollout that falls further
    behind (``on_stale``: ``"continue"`` or ``"abort"``); ``tenant`` or
    ``group_prefix`` names its scope (exactly one of them)."""

    step: int
    eta: int
    on_stale: str = "continue"
    tenant: str | None = None
    group_prefix: str | None = None
    #: The fleet's id of this declaration (its shared count's key); "" alone.
    id: str = ""

    def __post_init__(self) -> None:
        if (self.tenant is None) == (self.group_prefix is None):
            raise ValueError("a staleness bound names exactly one of tenant and group_prefix")
        name = self.tenant if self.tenant is not None else self.group_prefix
        if not isinstance(name, str) or not name:
            raise ValueError("tenant / group_prefix must be a non-empty string")
        for name, value, least in (("step", self.step, 1), ("eta", self.eta, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be a whole number >= {least} (got {value!r})")
        if self.on_stale not in ON_STALE:
            raise ValueError(f"on_stale must be one of {', '.join(ON_STALE)} (got {self.on_stale!r})")

    @property
    def key(self) -> str:
        """``tenant:<name>`` or ``group:<prefix>`` (the fleet's record key too)."""
        return f"tenant:{self.tenant}" if self.tenant is not None else f"group:{self.group_prefix}"

    def to_json(self) -> dict[str, object]:
        return {
            "tenant": self.tenant,
            "group_prefix": self.group_prefix,
            "step": self.step,
            "eta": self.eta,
            "on_stale": self.on_stale,
        }


class SharedCount(Protocol):
    """Rollouts started, counted in the fleet's state store (docs/fleet.md): ``take``
    one if fewer than ``allowed`` started under declaration ``bound`` (True), else
    False; ``give_back`` one taken for a request that left before it started."""

    def take(self, bound: StalenessBound, allowed: int) -> Awaitable[bool]: ...

    def give_back(self, bound: StalenessBound) -> Awaitable[None]: ...


class _Scope:
    __slots__ = ("bound", "base", "started", "waiting", "running", "releasing")

    def __init__(self, bound: StalenessBound, base: int) -> None:
        self.bound = bound
        self.base = base  # the version index at the declaration
        self.started = 0
        self.waiting: deque[tuple[Request, trio.Event]] = deque()
        self.running: dict[Request, int] = {}  # -> the version index it runs under
        self.releasing = False  # a fleet release is taking shared counts for it


class Admission:
    """The staleness bounds of one client (see the module).

    ``continue_stale(reqs)`` / ``abort_stale(reqs)``: how the client ends the
    running rollouts that fell behind (started as background tasks)."""

    def __init__(
        self,
        order: VersionOrder,
        drain: Drain,
        control: EngineControl,
        abort_stale: Callable[[list[Request]], None],
        start_soon: Callable[..., object],
    ) -> None:
        self._order = order
        self._drain = drain
        self._control = control
        self._abort_stale = abort_stale
        self._start_soon = start_soon
        self._tenants: dict[str, _Scope] = {}
        self._families: dict[str, _Scope] = {}
        self.waiting = 0  # requests waiting at the gate now
        self._changed: trio.Event | None = None
        #: Set by a fleet member: the count is the fleet's, not this process's.
        self.shared: SharedCount | None = None
        order.on_advance.append(self.advanced)

    # -- declarations -------------------------------------------------------------

    def declare(self, bound: StalenessBound) -> None:
        """Start (or replace) ``bound``; counting starts afresh at the current version."""
        scopes = self._tenants if bound.tenant is not None else self._families
        name = bound.tenant if bound.tenant is not None else bound.group_prefix
        assert name is not None
        scope = _Scope(bound, self._order.current_index)
        old = scopes.get(name)
        if old is not None:  # its waiters and running rollouts carry over
            scope.waiting, scope.running = old.waiting, old.running
            scope.started = len(old.running)
        scopes[name] = scope
        self._release_all(scope)

    def withdraw(self, tenant: str | None = None, group_prefix: str | None = None) -> bool:
        """End a declaration: its waiters start at once. False if there was none."""
        scopes = self._tenants if tenant is not None else self._families
        scope = scopes.pop(tenant if tenant is not None else group_prefix or "", None)
        if scope is None:
            return False
        while scope.waiting:
            scope.waiting.popleft()[1].set()
            self.waiting -= 1
        return True

    @property
    def declared(self) -> bool:
        """Whether any bound is declared (else :meth:`admit` is a no-op; the client
        skips it, no coroutine made per request)."""
        return bool(self._tenants or self._families)

    def bounds(self) -> list[StalenessBound]:
        return [s.bound for s in (*self._tenants.values(), *self._families.values())]

    def statistics(self) -> list[dict[str, object]]:
        """Per declaration: the bound, ``started``, ``allowed``, ``waiting``, ``running``."""
        return [
            {
                **s.bound.to_json(),
                "started": s.started,
                "allowed": self._allowed(s),
                "waiting": len(s.waiting),
                "running": len(s.running),
            }
            for s in (*self._tenants.values(), *self._families.values())
        ]

    # -- the gate -----------------------------------------------------------------

    def _scope(self, req: Request) -> _Scope | None:
        if self._families and req.group is not None:
            best: _Scope | None = None
            for prefix, scope in self._families.items():
                if req.group.startswith(prefix) and (
                    best is None or len(prefix) > len(best.bound.group_prefix or "")
                ):
                    best = scope
            if best is not None:
                return best
        return self._tenants.get(req.tenant.name) if self._tenants else None

    def _allowed(self, scope: _Scope) -> int:
        b = scope.bound
        return (self._order.current_index - scope.base + b.eta + 1) * b.step

    async def admit(self, req: Request) -> bool:
        """Start ``req`` as a rollout of its scope, waiting while the bound is reached
        (FIFO). Returns whether it counted (then :meth:`leave` when it is answered).
        Raises ``DispatchAborted`` (an abort call ended the wait) or
        ``ShuttingDown`` (the drain's cutoff); cancellation propagates."""
        if not self._tenants and not self._families:
            return False
        scope = self._scope(req)
        if scope is None:
            return False
        if not scope.waiting and await self._take(scope):
            self._start(scope, req)
            return True
        event = trio.Event()
        scope.waiting.append((req, event))
        self.waiting += 1
        self._note()
        t0 = trio.current_time()
        try:
            with trio.CancelScope(deadline=self._drain.cutoff) as wait:
                req.admission_scope = wait
                with self._drain.bounding(wait, for_engine=False):
                    await event.wait()
        finally:
            req.admission_scope = None
            req.admission_time += trio.current_time() - t0
            if not event.is_set():
                scope.waiting.remove((req, event))  # O(waiting), only when it gives up
                self.waiting -= 1
        if event.is_set():
            return req in scope.running
        if req.abort_reason is not None:
            raise req.stamp(req.aborted())
        raise req.stamp(self._drain.refusal())

    async def wait_changed(self) -> None:
        """Return at the next change of :attr:`waiting` (a request waits or starts)."""
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    def _note(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def leave(self, req: Request) -> None:
        """``req`` (admitted by :meth:`admit`) was answered."""
        scope = self._scope(req)
        if scope is not None:
            scope.running.pop(req, None)

    def _start(self, scope: _Scope, req: Request) -> None:
        scope.started += 1
        scope.running[req] = self._order.current_index
        self._note()

    async def _take(self, scope: _Scope) -> bool:
        if self.shared is None:
            return scope.started < self._allowed(scope)
        return await self.shared.take(scope.bound, self._allowed(scope))

    def _release_all(self, scope: _Scope) -> None:
        if self.shared is None:
            self._release(scope)
        elif scope.waiting and not scope.releasing:
            self._start_soon(self._release_shared, scope)

    async def _release_shared(self, scope: _Scope) -> None:
        """As :meth:`_release`, each start taken from the fleet's count, in order."""
        scope.releasing = True
        try:
            while scope.waiting and self.shared is not None:
                if not await self.shared.take(scope.bound, self._allowed(scope)):
                    return
                if not scope.waiting:  # the waiter left meanwhile
                    await self.shared.give_back(scope.bound)
                    return
                req, event = scope.waiting.popleft()
                self.waiting -= 1
                self._start(scope, req)
                event.set()
        finally:
            scope.releasing = False

    def _release(self, scope: _Scope) -> None:
        allowed = self._allowed(scope)
        while scope.waiting and scope.started < allowed:
            req, event = scope.waiting.popleft()
            self.waiting -= 1
            self._start(scope, req)
            event.set()

    def advanced(self) -> None:
        """A new version is current: release what the bounds now allow, then handle
        the running rollouts that fell more than η behind."""
        current = self._order.current_index
        for scope in (*self._tenants.values(), *self._families.values()):
            self._release_all(scope)
            eta = scope.bound.eta
            stale = [req for req, at in scope.running.items() if current - at > eta]
            if not stale:
                continue
            for req in stale:
                scope.running[req] = current  # acted on once per falling behind
            log.info(
                "%d rollout(s) of %s fell more than %d version(s) behind: %s",
                len(stale), scope.bound.key, eta,
                "continued on the current weights" if scope.bound.on_stale == "continue" else "aborted",
            )
            if scope.bound.on_stale == "abort":
                self._abort_stale(stale)
            else:
                self._start_soon(self._continue_stale, stale)

    async def _continue_stale(self, reqs: Iterable[Request]) -> None:
        """End each of ``reqs`` on its engine (its abort route: the answer keeps its
        tokens) marked to continue on the current version (docs/operations.md,
        "Staleness-bounded admission")."""
        accepts = self._order.accepts(LATEST)
        on: dict[Engine, list[Request]] = {}
        for req in reqs:
            if req.aborted_by_call:
                continue
            req.accepts = accepts  # it and every continuation of it
            engine = req.engine
            if req.dispatched_at is not None and engine is not None:
                req.replay = CONTINUE
                on.setdefault(engine, []).append(req)
        for engine, ended in on.items():
            try:
                kind = await self._control.kind(engine.url)
                names = [name for req in ended for name in engine_names(req)]
                await self._control.abort_requests(engine.url, kind, names)
            except EngineControlError as exc:
                log.info(
                    "engine %s: cannot end %d stale rollout(s) to continue them (%s):"
                    " they run on there", engine.url, len(ended), exc,
                )
                for req in ended:
                    req.replay = None
