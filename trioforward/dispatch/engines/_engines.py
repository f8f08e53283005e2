"""The engine registry: one record per engine, its capacity and queue, and its health.

Each :class:`Engine` owns a :class:`~trioforward.dispatch.engines._fair.FairQueue` of
``engine_capacity`` tokens. That *is* the engine's queue (docs/dispatch.md,
"Engines, capacity and routing"): weighted fair between tenants, FIFO within one;
parked tasks are handed tokens one by one as they come back, nothing rescans
waiters. A request that finds no eligible engine at all (every engine paused or
ejected) parks in the registry's own FIFO lot and is let go, in order, when one
becomes eligible.

State changes (pause, ejection, removal) *re-route* the requests queued on that
engine: their queue wait is cancelled and they route again, so nobody waits for
capacity on an engine that will not take them. Re-routing walks only that
engine's own waiters, once, at the state change — never per request.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from trioforward._engine_url import engine_url
from trioforward._words import count_of
from trioforward.dispatch.engines._fair import FairQueue
from trioforward.dispatch.engines._routing import stable_hash

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._request import Request

__all__ = ["Engine", "EngineInfo", "Registry"]

log = logging.getLogger("trioforward.dispatch")


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """A snapshot of one engine (``client.engines.list()``).

    ``in_flight``: requests holding its capacity; ``queued``: waiting for it;
    ``capacity``: its queue's size (0 = unlimited); ``consecutive_failures``:
    failed health probes and connects since the last success; ``share``: requests
    this process may run on it at once (its queue's tokens: ``capacity`` unless
    a fleet set a smaller share, docs/fleet.md; 0 = unlimited); ``kind``:
    ``"vllm"``, ``"sglang"``, ``"openai"`` or ``None`` (not known yet);
    ``token_route``: whether it serves its kind's token route (SGLang
    ``/generate``, vLLM ``/inference/v1/generate``; ``None``: not known yet;
    docs/operations.md, "Engine kinds"); ``held_out``: why it takes no work
    although healthy and not paused (it has not reported the recorded weight
    version), or ``None``; ``weight_version``: the version it last reported
    (docs/operations.md, "One weight version across the engines"); ``limit``: the
    requests it may run at once as learnt from its load reports, or ``None`` (the
    static ``capacity``; docs/dispatch.md, "Capacity from the engine").
    """

    url: str
    healthy: bool
    paused: bool
    in_flight: int
    queued: int
    capacity: int
    consecutive_failures: int
    share: int = 0
    kind: str | None = None
    token_route: bool | None = None
    held_out: str | None = None
    weight_version: str | None = None
    limit: int | None = None


class Engine:
    """One engine's record. Mutated only from trio tasks (no locks: docs/design.md, "The connection pool")."""

    __slots__ = (
        "url",
        "seed",
        "capacity",
        "queue",
        "in_flight",
        "healthy",
        "paused",
        "removed",
        "eligible",
        "consecutive_failures",
        "consecutive_successes",
        "calls",
        "_idle",
        "health_scope",
        "paused_since",
        "ejections",
        "kind",
        "token_route",
        "kind_known",
        "served_model",
        "health_path",
        "held_out",
        "reported_version",
        "limit",
        "share",
        "reported",
        "saturated",
    )

    def __init__(self, url: str, capacity: int) -> None:
        self.url = url.rstrip("/")
        self.seed = stable_hash(self.url)
        self.capacity = capacity
        self.queue = FairQueue(capacity if capacity > 0 else math.inf, self)
        self.in_flight = 0
        self.healthy = True
        self.paused = False
        self.paused_since: float | None = None  # trio time of the pause (Retry-After hints)
        self.ejections = 0  # in a row, without a success between (re-admission back-off)
        self.removed = False
        self.eligible = True
        self.consecutive_failures = 0
        self.consecutive_successes = 0
        self.calls: set[Request] = set()  # dispatched here (for abort)
        self._idle: trio.Event | None = None
        self.health_scope: trio.CancelScope | None = None
        # Set by the kind detection (_kinds.py); kind_known once both are.
        self.kind: str | None = None
        self.token_route: bool | None = None
        self.kind_known = trio.Event()
        # SGLang: the served model name /model_info gave (its OpenAI routes name an
        # adapter "<base>:<adapter>": _adapters.engine_body); None when not read.
        self.served_model: str | None = None
        self.health_path = "/health"  # SGLang: "/ready" (_health.py)
        # Not running the recorded weight version (yet): why it takes no work, and
        # the version it last reported (docs/operations.md, "One weight version
        # across the engines"; _versions.py).
        self.held_out: str | None = None
        self.reported_version: str | None = None
        # Capacity from the engine (_adaptive.py): the learnt limit (None: the
        # static bound), this process's fleet share (None: all of it), the
        # sequences the engine last reported (running + waiting; 0 when no
        # usable report) and whether it queues or preempts.
        self.limit: int | None = None
        self.share: int | None = None
        self.reported = 0
        self.saturated = False

    @property
    def queued(self) -> int:
        """Requests parked in this engine's queue."""
        return len(self.queue)

    @property
    def outstanding(self) -> int:
        """Its load as routing counts it: queued here, plus the larger of this process's
        in-flight count and what the engine last reported (other gateways' too)."""
        return max(self.in_flight, self.reported) + len(self.queue)

    def set_limit(self, limit: int | None) -> None:
        """The learnt limit (``None``: back to the static ``capacity``)."""
        self.limit = limit
        self._apply()

    def set_share(self, share: int | None) -> None:
        """This process's fleet share of ``capacity`` (``None``: all of it)."""
        self.share = share
        self._apply()

    def _apply(self) -> None:
        bounds = [bound for bound in (self.share, self.limit) if bound is not None]
        tokens = min([self.capacity if self.capacity > 0 else math.inf, *bounds])
        if tokens != self.queue.total_tokens:
            self.queue.total_tokens = tokens

    @property
    def free_slot(self) -> bool:
        """A request routed here now takes a token without queueing."""
        return self.queue.available_tokens >= 1

    def info(self) -> EngineInfo:
        return EngineInfo(
            self.url,
            self.healthy,
            self.paused,
            self.in_flight,
            self.queued,
            self.capacity,
            self.consecutive_failures,
            int(tokens) if (tokens := self.queue.total_tokens) != math.inf else 0,
            self.kind,
            self.token_route if self.kind_known.is_set() else None,
            self.held_out,
            self.reported_version,
            self.limit,
        )

    def reroute_waiters(self) -> None:
        """Send every request queued here back to routing (state changed)."""
        for request in self.queue:
            request.rerouted = True
            if request.queue_scope is not None:
                request.queue_scope.cancel()

    def abort_calls(self, reason: str) -> None:
        """Cancel every request dispatched here; each raises ``DispatchAborted(reason)``."""
        for request in list(self.calls):
            request.abort(reason)

    def call_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None

    async def wait_idle(self) -> None:
        """Return once nothing is dispatched to this engine."""
        while self.in_flight > 0:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()


class Registry:
    """The engines of one client, in registration order, and the no-engine lot."""

    __slots__ = (
        "engines", "by_url", "capacity", "health_failures", "health_successes", "_lot", "_changed",
        "on_eject", "on_readmit",
    )  # fmt: skip

    def __init__(self, capacity: int, health_failures: int, health_successes: int) -> None:
        self.engines: list[Engine] = []
        self.by_url: dict[str, Engine] = {}
        self.capacity = capacity
        self.health_failures = health_failures
        self.health_successes = health_successes
        self._lot = trio.lowlevel.ParkingLot()
        self._changed: trio.Event | None = None
        # Called with each engine ejected (the client schedules re-admission when
        # no health probes run).
        self.on_eject: Callable[[Engine], None] | None = None
        # Called as an ejected engine is re-admitted (the weight-version gate holds it).
        self.on_readmit: Callable[[Engine], None] | None = None

    # -- membership -----------------------------------------------------------

    def add(self, url: str) -> tuple[Engine, bool]:
        """Register ``url`` (idempotent): the engine, and whether it is new.

        Raises :class:`EngineURLError` (a ``ValueError``) naming what is wrong
        with a bad URL (docs/server.md, "Engine URLs").
        """
        key = engine_url(url)
        engine = self.by_url.get(key)
        if engine is not None:
            return engine, False
        engine = Engine(key, self.capacity)
        # Copy-on-write: routing iterates ``engines`` without holding anything.
        self.engines = [*self.engines, engine]
        self.by_url[key] = engine
        self.wake()
        return engine, True

    def remove(self, url: str) -> Engine | None:
        """Unregister ``url``: in-flight requests are aborted, queued ones re-routed."""
        engine = self.by_url.pop(url.rstrip("/"), None)
        if engine is None:
            return None
        self.engines = [e for e in self.engines if e is not engine]
        engine.removed = True
        self._refresh(engine)
        engine.abort_calls(f"engine {engine.url} was removed")
        if not self.engines:
            # Nothing left to wait for: parked requests fail now (NoEngineAvailable).
            self._lot.unpark_all()
        if engine.health_scope is not None:
            engine.health_scope.cancel()
        return engine

    def get(self, url: str) -> Engine:
        engine = self.by_url.get(url.rstrip("/"))
        if engine is None:
            raise KeyError(f"engine {url!r} is not registered")
        return engine

    # -- eligibility ----------------------------------------------------------

    def _refresh(self, engine: Engine) -> None:
        was = engine.eligible
        engine.eligible = (
            engine.healthy and not engine.paused and not engine.removed and engine.held_out is None
        )
        if was and not engine.eligible:
            engine.reroute_waiters()
        elif engine.eligible and not was:
            self.wake()
        if was is not engine.eligible:
            if self._changed is not None:
                self._changed.set()
                self._changed = None

    def any_healthy_paused(self) -> bool:
        """Whether some engine is only paused (healthy, registered): O(engines)."""
        return any(
            e.healthy and (e.paused or e.held_out is not None) and not e.removed for e in self.engines
        )

    async def wait_changed(self) -> None:
        """Return at the next change of any engine's eligibility (health, pause, removal)."""
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    def notify_changed(self) -> None:
        """Something requests route by changed other than an engine's eligibility (a
        new weight version: dispatch/rollout/_staleness.py): wake the waits of
        :meth:`wait_changed` and the first parked request."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        self.wake()

    def set_held(self, engine: Engine, reason: str | None) -> None:
        """Hold ``engine`` out of dispatch for ``reason`` (``None``: release it; _versions.py)."""
        engine.held_out = reason
        self._refresh(engine)

    def set_paused(self, engine: Engine, paused: bool) -> None:
        if paused and not engine.paused:
            engine.paused_since = trio.current_time()
        elif not paused:
            engine.paused_since = None
        engine.paused = paused
        self._refresh(engine)

    def record_failure(self, engine: Engine) -> None:
        """A failed health probe or connect; ejects after ``health_failures`` in a row."""
        engine.consecutive_failures += 1
        engine.consecutive_successes = 0
        if (
            engine.healthy
            and self.health_failures > 0
            and engine.consecutive_failures >= self.health_failures
        ):
            engine.healthy = False
            engine.ejections += 1
            self._refresh(engine)
            if self.on_eject is not None:
                self.on_eject(engine)
            # Without this line an operator sees nothing: requests for an
            # ejected engine wait in QUEUED, they do not fail. (INFO, the
            # gateway's default level: the demo kills an engine on purpose.)
            log.info(
                "engine %s ejected after %s; %d of %d engine(s) healthy",
                engine.url,
                count_of(engine.consecutive_failures, "consecutive failures"),
                sum(e.healthy for e in self.engines),
                len(self.engines),
            )

    def readmit(self, engine: Engine) -> None:
        """Let an ejected engine take requests again on trial (no health probes run):
        the next failure ejects it again at once, the next success clears it."""
        if engine.healthy or engine.removed:
            return
        engine.healthy = True
        engine.consecutive_failures = max(0, self.health_failures - 1)
        if self.on_readmit is not None:
            self.on_readmit(engine)
        self._refresh(engine)
        log.info("engine %s re-admitted on trial (health probes are off)", engine.url)

    def record_success(self, engine: Engine, *, probe: bool) -> None:
        """The engine answered. Only health probes (or :meth:`readmit`, when they are
        off) re-admit an ejected engine."""
        engine.consecutive_failures = 0
        engine.ejections = 0
        if not probe:
            return
        engine.consecutive_successes += 1
        if not engine.healthy and engine.consecutive_successes >= self.health_successes:
            engine.healthy = True
            if self.on_readmit is not None:
                self.on_readmit(engine)  # it may have restarted on other weights
            self._refresh(engine)
            log.info("engine %s healthy again (re-admitted)", engine.url)

    # -- waiting for any eligible engine ----------------------------------------

    def wake(self) -> None:
        """An engine became eligible: let the first parked request route again."""
        if self._lot:
            self._lot.unpark()

    async def wait_eligible(self) -> None:
        """Park (FIFO) until :meth:`wake`. The woken request calls :meth:`wake` again
        once it has routed, so parked requests leave one by one, in order."""
        await self._lot.park()
