"""LoRA adapters: the name -> path registry and single-flight loading (docs/dispatch.md, "LoRA adapters").

An adapter known to the registry is loaded on an engine on demand with
``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` (docs/compatibility.md, "vLLM engines"). Loads
are single-flight per (engine, adapter): the first request that needs one starts
it, every other request for the same pair waits on that load and shares its
outcome. A 400 saying the adapter "has already been loaded" is success.

SGLang engines (kind ``sglang``) take the same bodies without ``/v1``:
``POST /load_lora_adapter`` / ``POST /unload_lora_adapter``, answering 200 or
400 with ``{"success", "error_message", "loaded_adapters"}``
(``srt/entrypoints/http_server.py``, ``io_struct.LoRAUpdateOutput``).
"""

from __future__ import annotations

import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable

import orjson
import trio

from trioforward import Phase
from trioforward.dispatch.engines._engines import Engine
from trioforward.errors import AdapterLoadError
from trioforward.http import ConnectionPool, PoolError

__all__ = ["AdapterRegistry", "AdapterLoader", "engine_body"]

log = logging.getLogger("trioforward.dispatch")


def engine_body(engine: Engine, path: str, content: bytes, name: str, registry: AdapterRegistry) -> bytes:
    """The body an OpenAI request naming adapter ``name`` goes to ``engine`` with: as
    it came, except on SGLang, whose OpenAI routes name an adapter ``"<base>:<name>"``
    (a bare ``name`` would be served by the base model: SGLang does not check it;
    ``srt/entrypoints/openai/serving_base.py``), so ``model`` is rewritten (the body
    re-encoded). ``<base>``: the served name from ``/model_info``, else the adapter's
    registered parent, else ``base`` (SGLang reads only what follows the colon)."""
    if engine.kind != "sglang" or not path.startswith("/v1/"):
        return content
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    if not isinstance(data, dict) or data.get("model") != name:
        return content
    data["model"] = f"{engine.served_model or registry.parent(name) or 'base'}:{name}"
    return orjson.dumps(data)


def _lora_path(engine: Engine, call: str) -> str:
    """The adapter route ``call`` (``load`` / ``unload``) of ``engine``'s kind."""
    return f"/{call}_lora_adapter" if engine.kind == "sglang" else f"/v1/{call}_lora_adapter"


class AdapterRegistry:
    """``client.adapters``: which model names are LoRA adapters, and where they live."""

    __slots__ = ("_paths", "_parents", "limit", "in_use", "dropped")

    def __init__(self, paths: dict[str, str] | None = None, limit: int = 0) -> None:
        # Least recently used first: registration and each dispatch move a name last.
        self._paths: OrderedDict[str, str] = OrderedDict(paths or {})
        self._parents: dict[str, str] = {}  # name -> base model, when one was given
        self.limit = limit  # 0 = unlimited
        self.in_use: Counter[str] = Counter()  # requests dispatched with the adapter now
        self.dropped = 0  # forgotten to stay within ``limit``

    def register(self, name: str, path: str, parent: str | None = None) -> None:
        """Make ``name`` loadable from ``path`` (an engine-side path); ``parent`` is
        the base model it was trained from, as ``/v1/models`` shows it (a
        re-registration without one clears the old one).

        Beyond ``limit`` registered adapters the least recently used one that no
        request is using is forgotten (an RL run makes one adapter per step; the
        old ones are not asked for again). If every one is in use the registry
        stays over the bound until the next registration.
        """
        if not name or not path:
            raise ValueError("an adapter needs a name and a path")
        self._paths[name] = path
        self._paths.move_to_end(name)
        if parent:
            self._parents[name] = parent
        else:
            self._parents.pop(name, None)
        excess = len(self._paths) - self.limit if self.limit else 0
        if excess > 0:
            for old in [n for n in self._paths if n != name and not self.in_use.get(n)][:excess]:
                del self._paths[old]
                self._parents.pop(old, None)
                self.dropped += 1

    def touch(self, name: str) -> None:
        """``name`` was just asked for: it becomes the most recently used."""
        if name in self._paths:
            self._paths.move_to_end(name)

    def unregister(self, name: str) -> None:
        """Forget ``name`` (engines that loaded it keep it). Unknown names are ignored."""
        self._paths.pop(name, None)
        self._parents.pop(name, None)

    def parent(self, name: str) -> str | None:
        """The base model ``name`` was registered with, or None."""
        return self._parents.get(name)

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

    __slots__ = (
        "registry",
        "pool",
        "timeout",
        "max_loaded",
        "loads",
        "unloads",
        "_epochs",
        "_flights",
        "_loaded",
        "_busy",
        "_spawn",
        "_trimming",
    )

    def __init__(
        self,
        registry: AdapterRegistry,
        pool: ConnectionPool,
        timeout: float,
        max_loaded: int = 0,
        spawn: Callable[[Callable[[], Awaitable[None]]], None] | None = None,
    ) -> None:
        self.registry = registry
        self.pool = pool
        self.timeout = timeout
        self.max_loaded = max_loaded  # per engine; 0 = unlimited
        # Per engine URL, not per adapter: a run makes a new adapter per step.
        self.loads: Counter[str] = Counter()
        self.unloads: Counter[str] = Counter()
        self._epochs: dict[tuple[str, str], int] = {}
        self._flights: dict[tuple[str, str], _Flight] = {}
        # engine URL -> adapters we loaded there, least recently used first.
        self._loaded: dict[str, OrderedDict[str, None]] = {}
        self._busy: Counter[tuple[str, str]] = Counter()  # dispatched requests per pair
        # Runs a trim in the background (the client's nursery.start_soon): a request
        # releases its adapter in a ``finally``, where it cannot wait for an unload.
        self._spawn = spawn
        self._trimming: set[str] = set()  # engine URLs with a trim under way

    def begin(self, engine: Engine, name: str) -> None:
        """A request for adapter ``name`` is dispatched to ``engine``: it is in use
        there (never unloaded meanwhile) and the most recently used."""
        self._busy[(engine.url, name)] += 1
        self.registry.in_use[name] += 1
        self.registry.touch(name)
        loaded = self._loaded.get(engine.url)
        if loaded is not None and name in loaded:
            loaded.move_to_end(name)

    def end(self, engine: Engine, name: str) -> None:
        """The request :meth:`begin` counted has left ``engine``."""
        key = (engine.url, name)
        self._busy[key] -= 1
        if self._busy[key] <= 0:
            del self._busy[key]
        self.registry.in_use[name] -= 1
        if self.registry.in_use[name] <= 0:
            del self.registry.in_use[name]
        if key not in self._busy:
            self._trim_later(engine)

    def _trim_later(self, engine: Engine) -> None:
        """``engine`` has an adapter no request uses any more: if the gateway keeps
        more than ``max_loaded`` there, unload the least recently used idle ones in
        the background (one trim per engine at a time)."""
        url = engine.url
        loaded = self._loaded.get(url)
        if (
            not self.max_loaded
            or loaded is None
            or len(loaded) <= self.max_loaded
            or self._spawn is None
            or url in self._trimming
            or all(self._busy.get((url, n)) for n in loaded)
        ):
            return
        self._trimming.add(url)

        async def trim() -> None:
            try:
                await self._evict(engine, loaded)
            finally:
                self._trimming.discard(url)
            self._trim_later(engine)  # an adapter released while this one ran

        self._spawn(trim)

    def loaded(self) -> dict[str, list[str]]:
        """Engine URL -> the adapters loaded there by the gateway, least recently used first."""
        return {url: list(names) for url, names in self._loaded.items() if names}

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
                engine.url + _lora_path(engine, "load"),
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
                self.loads[engine.url] += 1
            loaded = self._loaded.setdefault(engine.url, OrderedDict())
            loaded[name] = None
            loaded.move_to_end(name)
            await self._evict(engine, loaded)
            return
        detail = response.content[:300].decode("utf-8", "replace")
        if status == 404:
            raise AdapterLoadError(
                f"cannot load LoRA adapter {name!r} (path {path!r}) on {engine.url}: "
                f"POST {_lora_path(engine, 'load')} answered 404 (runtime LoRA loading disabled, "
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

    async def _evict(self, engine: Engine, loaded: OrderedDict[str, None]) -> None:
        """Unload least recently used adapters not in use on ``engine`` until at most
        ``max_loaded`` remain (vLLM holds ``--max-cpu-loras``; its API server keeps
        every adapter ever loaded listed until it is unloaded). Runs after each load
        and, in the background, each time a request releases an adapter while the
        engine is over the bound (:meth:`end`): over it while all are in use, the
        engine comes back within it as they are released."""
        url = engine.url
        while self.max_loaded and len(loaded) > self.max_loaded:
            victim = next((n for n in loaded if not self._busy.get((url, n))), None)
            if victim is None:
                return
            del loaded[victim]
            await self._unload(engine, victim)

    async def _unload(self, engine: Engine, name: str) -> None:
        """``POST /v1/unload_lora_adapter``; a failure is logged, not raised (a request
        for the adapter that finds it missing loads it again, single-flight)."""
        deadline = trio.current_time() + self.timeout if self.timeout is not None else math.inf
        try:
            response = await self.pool.request(
                "POST",
                engine.url + _lora_path(engine, "unload"),
                headers=[(b"content-type", b"application/json")],
                content=orjson.dumps({"lora_name": name}),
                deadline=deadline,
            )
        except PoolError as exc:
            log.warning("could not unload LoRA adapter %s on %s: %s", name, engine.url, exc)
            return
        if response.status == 200:
            self.unloads[engine.url] += 1
        elif response.status != 404:  # 404: not loaded (the engine restarted): fine
            log.warning(
                "engine %s refused to unload LoRA adapter %s: %d", engine.url, name, response.status
            )
