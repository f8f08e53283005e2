"""LoRA adapters: the name -> path registry and single-flight loading (docs/dispatch.md, "LoRA adapters").

An adapter known to the registry is loaded on an engine on demand with
``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` (docs/compatibility.md, "vLLM engines"). Loads
are single-flight per (engine, adapter): the first request that needs one starts
it, every other request for the same pair waits on that load and shares its
outcome. A 400 saying the adapter "has already been loaded" is success.
"""

from __future__ import annotations

import math
from collections import Counter

import orjson
import trio

from trioforward.dispatch._engines import Engine
from trioforward.errors import AdapterLoadError
from trioforward.http import ConnectionPool, Phase, PoolError

__all__ = ["AdapterRegistry", "AdapterLoader"]


class AdapterRegistry:
    """``client.adapters``: which model names are LoRA adapters, and where they live."""

    __slots__ = ("_paths",)

    def __init__(self, paths: dict[str, str] | None = None) -> None:
        self._paths: dict[str, str] = dict(paths or {})

    def register(self, name: str, path: str) -> None:
        """Make ``name`` loadable from ``path`` (an engine-side path)."""
        if not name or not path:
            raise ValueError("an adapter needs a name and a path")
        self._paths[name] = path

    def unregister(self, name: str) -> None:
        """Forget ``name`` (engines that loaded it keep it). Unknown names are ignored."""
        self._paths.pop(name, None)

    def list(self) -> dict[str, str]:
        """A copy of the registry: name -> path."""
        return dict(self._paths)

    def is_adapter(self, name: str | None) -> bool:
        return name is not None and name in self._paths

    def path(self, name: str) -> str:
        return self._paths[name]

    def __bool__(self) -> bool:
        return bool(self._paths)


class _Flight:
    """One adapter load in progress; late requests wait on it (single-flight)."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: BaseException | None = None


class AdapterLoader:
    """Loads adapters on engines, one load per (engine, adapter) at a time.

    All adapter state of the dispatch core lives here, keyed by
    ``(engine URL, adapter name)``: ``loads`` (successful loads, for
    statistics), the load *epoch* (bumped by each finished load, so an attempt
    that raced a load does not start another) and the loads in progress.
    """

    __slots__ = ("registry", "pool", "timeout", "loads", "_epochs", "_flights")

    def __init__(self, registry: AdapterRegistry, pool: ConnectionPool, timeout: float) -> None:
        self.registry = registry
        self.pool = pool
        self.timeout = timeout
        self.loads: Counter[tuple[str, str]] = Counter()
        self._epochs: dict[tuple[str, str], int] = {}
        self._flights: dict[tuple[str, str], _Flight] = {}

    async def before_attempt(self, engine: Engine, name: str) -> int:
        """Wait for a load of ``name`` under way on ``engine`` (skip the race), then
        return the load epoch to pass to :meth:`ensure_loaded` if the attempt
        finds the adapter missing."""
        key = (engine.url, name)
        flight = self._flights.get(key)
        if flight is not None:
            await flight.done.wait()
        return self._epochs.get(key, 0)

    async def ensure_loaded(self, engine: Engine, name: str, *, seen_epoch: int) -> None:
        """Make sure ``name`` is loaded on ``engine``.

        ``seen_epoch`` is what :meth:`before_attempt` returned for the failed
        attempt; if a load finished since, the attempt just raced it and no new load
        is needed. Raises :class:`AdapterLoadError` (shared by every waiter of the
        same flight). Cancellation: a waiter may leave; the load itself runs in
        the task that started it.
        """
        key = (engine.url, name)
        if self._epochs.get(key, 0) != seen_epoch:
            return
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = _Flight()
            try:
                await self._load(engine, name)
            except BaseException as exc:
                flight.error = exc
                raise
            finally:
                del self._flights[key]
                flight.done.set()
            return
        await flight.done.wait()
        error = flight.error
        if isinstance(error, AdapterLoadError):
            # Each waiter raises its own copy: the dispatch core fills in per-request
            # fields (attempts, times), and a traceback belongs to one task.
            raise AdapterLoadError(
                error.message,
                adapter=error.adapter,
                status=error.status,
                phase=error.phase,
                engine=error.engine,
            )
        if flight.error is not None:
            # The loader was cancelled (its caller left): try again ourselves.
            await self.ensure_loaded(engine, name, seen_epoch=self._epochs.get(key, 0))

    async def _load(self, engine: Engine, name: str) -> None:
        path = self.registry.path(name)
        body = orjson.dumps({"lora_name": name, "lora_path": path})
        deadline = trio.current_time() + self.timeout if self.timeout is not None else math.inf
        try:
            response = await self.pool.request(
                "POST",
                engine.url + "/v1/load_lora_adapter",
                headers=[(b"content-type", b"application/json")],
                content=body,
                deadline=deadline,
            )
        except PoolError as exc:
            raise AdapterLoadError(
                f"could not load LoRA adapter {name!r} on {engine.url}: {exc}",
                adapter=name,
                phase=exc.phase,
                engine=engine.url,
            ) from exc
        status = response.status
        if status == 200 or (status == 400 and b"already" in response.content.lower()):
            key = (engine.url, name)
            self._epochs[key] = self._epochs.get(key, 0) + 1
            if status == 200:
                self.loads[(engine.url, name)] += 1
            return
        detail = response.content[:300].decode("utf-8", "replace")
        if status == 404:
            raise AdapterLoadError(
                f"cannot load LoRA adapter {name!r} (path {path!r}) on {engine.url}: "
                f"POST /v1/load_lora_adapter answered 404 (runtime LoRA loading disabled, "
                f"or no adapter at that path): {detail}",
                adapter=name,
                status=502,
                phase=Phase.READ_BODY,
                engine=engine.url,
            )
        raise AdapterLoadError(
            f"engine {engine.url} refused to load LoRA adapter {name!r} (path {path!r}): {status} {detail}",
            adapter=name,
            status=status if 400 <= status < 500 else 502,
            phase=Phase.READ_BODY,
            engine=engine.url,
        )
