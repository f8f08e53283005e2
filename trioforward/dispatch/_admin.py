"""``client.engines``: the run-time engine administration API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trioforward.dispatch._engines import EngineInfo

if TYPE_CHECKING:
    from trioforward.dispatch._client import Client

__all__ = ["Engines"]


class Engines:
    """``client.engines``: add, remove and list engines at run time (all synchronous)."""

    __slots__ = ("_client",)

    def __init__(self, client: Client) -> None:
        self._client = client

    def add(self, url: str) -> EngineInfo:
        """Register ``url`` (``http://host:port``); starts its health probes. Idempotent.

        Raises :class:`~trioforward._engine_url.EngineURLError` (a ``ValueError``)
        saying what is wrong with a bad URL (docs/server.md, "Engine URLs").

        An engine added while every engine is paused (``pause()`` with no list)
        starts paused too.
        """
        client = self._client
        known = url.rstrip("/") in client._registry.by_url
        engine = client._registry.add(url)
        if not known:
            if client._paused_all:
                client._registry.set_paused(engine, True)
            client._start_health(engine)
        return engine.info()

    def remove(self, url: str) -> bool:
        """Unregister ``url``. Its in-flight requests fail with :class:`DispatchAborted`;
        its queued ones are routed again. Returns False if it was not registered."""
        return self._client._registry.remove(url) is not None

    def list(self) -> list[EngineInfo]:
        """A snapshot of every engine, in registration order."""
        return [e.info() for e in self._client._registry.engines]

    def __len__(self) -> int:
        return len(self._client._registry.engines)
