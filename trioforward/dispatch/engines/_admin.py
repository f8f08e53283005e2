"""``client.engines``: the run-time engine administration API."""

from __future__ import annotations

from collections.abc import Callable

from trioforward.dispatch.engines._engines import Engine, EngineInfo, Registry
from trioforward.dispatch.engines._kinds import KINDS

__all__ = ["Engines"]


class Engines:
    """``client.engines``: add, remove and list engines, and set this process's share
    of an engine's capacity, at run time (all synchronous).

    A facade over the client's :class:`Registry`; ``on_added(engine)`` is called
    once for each newly registered engine (the client pauses it if everything
    is paused and starts its health probes).
    """

    __slots__ = ("_registry", "_on_added")

    def __init__(self, registry: Registry, on_added: Callable[[Engine, str | None], None]) -> None:
        self._registry = registry
        self._on_added = on_added

    def add(self, url: str, kind: str | None = None) -> EngineInfo:
        """Register ``url`` (``http://host:port``); starts its health probes and the
        detection of its kind. Idempotent (a known engine keeps its kind).

        ``kind``: ``"vllm"``, ``"sglang"`` or ``"openai"`` set by the operator;
        ``None``: ``engine_kinds`` / ``engine_kind``, else detected
        (docs/operations.md, "Engine kinds").

        Raises :class:`~trioforward._engine_url.EngineURLError` (a ``ValueError``)
        saying what is wrong with a bad URL (docs/server.md, "Engine URLs"), and
        ``ValueError`` for another ``kind``.

        An engine added while every engine is paused (``pause()`` with no list)
        starts paused too.
        """
        if kind is not None and kind not in KINDS:
            raise ValueError(f"an engine kind is one of {', '.join(KINDS)} (got {kind!r})")
        engine, new = self._registry.add(url)
        if new:
            self._on_added(engine, kind)
        return engine.info()

    def get(self, url: str) -> Engine:
        """The record of registered engine ``url`` (``KeyError`` otherwise)."""
        return self._registry.get(url)

    def remove(self, url: str) -> bool:
        """Unregister ``url``. Its in-flight requests fail with :class:`DispatchAborted`;
        its queued ones are routed again. Returns False if it was not registered."""
        return self._registry.remove(url) is not None

    def set_share(self, url: str, tokens: int | None) -> None:
        """Let this process run at most ``tokens`` requests at once on ``url``:
        its share of the engine's ``engine_capacity`` (docs/fleet.md, "Capacity
        leases"); ``None`` gives the whole capacity back.

        With ``adaptive_capacity`` the engine runs at most the smaller of the
        share and its learnt limit. Lowering a share never cancels running requests: it only stops new grants
        until fewer than ``tokens`` run. Raising it wakes queued requests at once.
        Raises ``KeyError`` for an unknown engine and ``ValueError`` for
        ``tokens < 1`` (an engine queue holds at least one token).
        """
        engine = self._registry.get(url)
        if tokens is not None and tokens < 1:
            raise ValueError(f"an engine share is at least 1 request (got {tokens})")
        engine.set_share(tokens)

    async def wait_kind(self, url: str) -> EngineInfo:
        """Return once ``url``'s kind and token route are known (detected or set,
        docs/operations.md, "Engine kinds"): its snapshot. Raises ``KeyError``
        for an unknown engine. Unbounded: put a deadline around it."""
        engine = self._registry.get(url)
        await engine.kind_known.wait()
        return engine.info()

    def list(self) -> list[EngineInfo]:
        """A snapshot of every engine, in registration order."""
        return [e.info() for e in self._registry.engines]

    def __len__(self) -> int:
        return len(self._registry.engines)
