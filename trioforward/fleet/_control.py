"""The fleet's control plane: pause/resume, engines and adapters, applied by every member.

State lives in Redis as three hashes and a version (docs/fleet.md, "Control
plane"): ``paused`` (``"*"`` or an engine URL -> pause mode), ``engines``
(URL -> ``add`` | ``remove``, on top of the configured engines) and
``adapters`` (name -> ``{"path", "parent"}`` as JSON; ``""`` unregisters one,
configured or not); two lists of one-shot records each member runs once,
``aborts`` and ``confirms`` (an operator's word that an engine runs a weight
version); and ``staleness``, the staleness bounds (``_staleness.py``). An
admin change is one ``MULTI`` transaction that edits a hash and increments the
version, then a ``PUBLISH`` of the version on the fleet's announce channel.

Every member applies the *whole* state (idempotently, as a diff against what it
applied last) when it hears the announcement or when its heartbeat sees a newer
version, then publishes the version it applied in its heartbeat record. The
admin call returns once every live member applied its version - so a
``pause(mode="wait")`` returns when no member runs anything on the paused
engines - or raises :class:`FleetLagging` naming the members that did not
within ``ack_timeout``. A joining member applies the current state before it
takes traffic (:func:`~trioforward.fleet.open_fleet`).

Public interface (what admin routes and other features build on), methods of
:class:`ControlPlane`: ``pause`` / ``resume``, ``add_engine`` / ``remove_engine``,
``register_adapter`` / ``unregister_adapter``, ``declare_staleness`` /
``withdraw_staleness``, ``abort``, ``confirm_version``, ``applied_version``, ``wait_applied``.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import orjson
import trio

from trioforward.dispatch import StalenessBound, fleet_pause_args
from trioforward.fleet._futures import StateUnavailable
from trioforward.fleet._redis import STATE_ERRORS
from trioforward.fleet._staleness import SharedStaleness, declaration, withdrawal

if TYPE_CHECKING:
    from trioforward.fleet._member import Fleet

__all__ = ["ControlPlane", "FleetLagging"]

log = logging.getLogger("trioforward.fleet")

ALL = "*"
#: Abort records kept in the control state, and remembered as run by a member.
ABORTS_KEPT = 64


class FleetLagging(Exception):
    """Some live members did not apply a control change in time (HTTP 503).
    ``.members``: their ids; ``.version``: the change's version."""

    def __init__(self, version: int, members: list[str]) -> None:
        super().__init__(
            f"control change {version} not applied by {len(members)} member(s) in time: "
            + ", ".join(members)
        )
        self.version = version
        self.members = members


class ControlPlane:
    """One member's side of the control plane. Built by the :class:`Fleet`."""

    def __init__(self, fleet: Fleet, client: Any) -> None:
        self._fleet = fleet
        self._client = client
        self._keys = fleet.keys
        settings = fleet.settings
        # Long enough for every member to hear, apply and heartbeat once more.
        self.ack_timeout = max(2.0, 2 * settings.member_ttl)
        self.applied_version = 0
        self._wanted = 0  # highest version heard of
        self._wake = trio.Event()
        self._applied_event = trio.Event()
        # What this member applied last (it starts from its configuration).
        self._paused_all = False
        self._paused: set[str] = set()
        # Aborts (docs/operations.md, "Over-sampling: cancelling a round's stragglers"):
        # what this member runs for one (set by the server to include its Tinker
        # queue; default: the dispatch client's), and the abort records it ran already.
        self.abort_hook: Callable[[list[str] | None, str | None, bool], Awaitable[dict[str, int]]] = (
            self._client_abort
        )
        self._aborts_run: deque[str] = deque(maxlen=ABORTS_KEPT)
        self._confirms_run: deque[str] = deque(maxlen=ABORTS_KEPT)
        # Staleness bounds: applied here, their started rollouts counted fleet-wide.
        self._staleness = SharedStaleness(fleet, client)

    async def _client_abort(
        self, ids: list[str] | None, group: str | None, every: bool
    ) -> dict[str, int]:
        counts = await self._client.abort(group=group, request_ids=ids, all=every)
        return dict(counts.to_json())

    # -- admin changes (any member) ------------------------------------------------

    async def pause(self, engines: Iterable[str] | None = None, mode: str = "wait") -> int:
        """Pause ``engines`` (default: all) on every member; returns the version once
        all live members applied it (``wait``: their in-flight requests finished;
        ``abort``: cancelled). Raises :class:`FleetLagging`, or
        :class:`~trioforward.fleet.StateUnavailable` when Redis does not answer."""
        targets = [ALL] if engines is None else [e.rstrip("/") for e in engines]
        key = self._keys.control("paused")
        return await self._change(lambda p: p.hset(key, dict.fromkeys(targets, mode)))

    async def resume(
        self, engines: Iterable[str] | None = None, weight_version: str | None = None
    ) -> int:
        """Resume ``engines`` (default: all, including engines paused one by one);
        ``weight_version``: recorded by every member before its gate opens
        (docs/operations.md, "Fleet mode")."""
        key = self._keys.control("paused")
        version_key = self._keys.control("weight_version")
        targets = None if engines is None else [e.rstrip("/") for e in engines]

        def edit(p: Any) -> None:
            if weight_version is not None:
                p.set(version_key, weight_version)
            if targets is None:
                p.delete([key])
            else:
                p.hdel(key, targets)

        return await self._change(edit)

    async def declare_staleness(self, bound: StalenessBound) -> int:
        """Declare ``bound`` on every member (docs/operations.md, "Staleness-bounded admission")."""
        fields = declaration(bound)
        return await self._change(lambda p: p.hset(self._keys.control("staleness"), fields))

    async def withdraw_staleness(self, tenant: str | None, group_prefix: str | None) -> int:
        """Withdraw the bound of ``tenant`` or ``group_prefix`` on every member."""
        fields = withdrawal(tenant, group_prefix)
        return await self._change(lambda p: p.hset(self._keys.control("staleness"), fields))

    async def add_engine(self, url: str) -> int:
        """Register ``url`` on every member."""
        key = self._keys.control("engines")
        return await self._change(lambda p: p.hset(key, {url.rstrip("/"): "add"}))

    async def remove_engine(self, url: str) -> int:
        """Unregister ``url`` on every member (configured or added)."""
        key = self._keys.control("engines")
        return await self._change(lambda p: p.hset(key, {url.rstrip("/"): "remove"}))

    async def register_adapter(self, name: str, path: str, parent: str | None = None) -> int:
        """Register adapter ``name`` at ``path`` (trained from base model ``parent``)
        on every member."""
        key = self._keys.control("adapters")
        record = orjson.dumps({"path": path, "parent": parent}).decode()
        return await self._change(lambda p: p.hset(key, {name: record}))

    async def unregister_adapter(self, name: str) -> int:
        """Unregister adapter ``name`` on every member."""
        key = self._keys.control("adapters")
        return await self._change(lambda p: p.hset(key, {name: ""}))

    async def confirm_version(self, url: str, version: str) -> int:
        """The operator's word that engine ``url`` runs weight ``version`` (one that
        cannot report it: docs/operations.md, "One weight version across the
        engines"), applied once by every member: a member holding ``url`` out for
        that version takes it back. A member that joins later applies the records
        kept (the last :data:`ABORTS_KEPT`) when it joins. Raises
        :class:`FleetLagging`, :class:`~trioforward.fleet.StateUnavailable`."""
        record = orjson.dumps({"id": uuid.uuid4().hex, "url": url.rstrip("/"), "version": version})
        key = self._keys.control("confirms")

        def edit(p: Any) -> None:
            p.rpush(key, [record])
            p.ltrim(key, -ABORTS_KEPT, -1)

        return await self._change(edit)

    async def abort(self, ids: list[str] | None, group: str | None, every: bool) -> dict[str, Any]:
        """Abort on every member: the record is appended to the control state's
        ``aborts`` list (the last :data:`ABORTS_KEPT`), each member runs it once
        and writes its counts beside it; returns their sums and ``"members"``
        (member id -> counts) once every live member ran it. Raises
        :class:`FleetLagging`, :class:`~trioforward.fleet.StateUnavailable`."""
        abort_id = uuid.uuid4().hex
        record = orjson.dumps({"id": abort_id, "ids": ids, "group": group, "all": every})
        key = self._keys.control("aborts")

        def edit(p: Any) -> None:
            p.rpush(key, [record])
            p.ltrim(key, -ABORTS_KEPT, -1)

        await self._change(edit)
        raw = await self._read_hash(f"abort:{abort_id}")
        members = {m: orjson.loads(v) for m, v in sorted(raw.items())}
        total = {k: sum(c.get(k, 0) for c in members.values()) for k in ("queued", "on_engine", "finished")}
        return {**total, "members": members}

    async def paused_at_engine_level(self, engines: Iterable[str] | None) -> list[str] | None:
        """Which of ``engines`` (``None``: all) the fleet paused at the engine level
        (a pause with ``engine_mode``), from the shared state; ``None`` means all of
        them. A gate-only pause is not listed: resuming it never calls an engine.
        Raises :class:`~trioforward.fleet.StateUnavailable` when Redis does not answer."""
        paused = await self._read_hash("paused")
        if ALL in paused and _engine_level(paused[ALL]):
            return None if engines is None else [e.rstrip("/") for e in engines]
        urls = [u for u, v in paused.items() if u != ALL and _engine_level(v)]
        return urls if engines is None else [u for u in (e.rstrip("/") for e in engines) if u in urls]

    async def _read_hash(self, name: str) -> dict[str, str]:
        """The control state's hash ``name``, read within ``member_ttl``; raises
        :class:`~trioforward.fleet.StateUnavailable` when Redis does not answer."""
        with trio.move_on_after(self._fleet.settings.member_ttl):
            try:
                return _text(await self._fleet.redis.hgetall(self._keys.control(name)))
            except STATE_ERRORS as exc:
                raise StateUnavailable(f"shared state unreachable ({type(exc).__name__})") from None
        raise StateUnavailable("shared state did not answer in time")

    async def _change(self, edit: Any) -> int:
        keys = self._keys
        with trio.move_on_after(self._fleet.settings.member_ttl) as scope:
            try:
                async with self._fleet.redis.pipeline(transaction=True) as pipe:
                    edit(pipe)
                    version_reply = pipe.incr(keys.control("version"))
                version = int(await version_reply)
                await self._fleet.redis.publish(keys.announce, str(version).encode())
            except STATE_ERRORS as exc:
                raise StateUnavailable(f"shared state unreachable ({type(exc).__name__})") from None
        if scope.cancelled_caught:
            raise StateUnavailable("shared state did not answer in time")
        self.heard(version)
        await self.wait_applied(version)
        return version

    async def wait_applied(self, version: int) -> None:
        """Return once every live member's heartbeat shows ``version`` applied.
        Raises :class:`FleetLagging` after :attr:`ack_timeout`."""
        fleet = self._fleet
        with trio.move_on_after(self.ack_timeout):
            while True:
                if self.applied_version >= version:
                    await fleet.wait_tick()  # a fresh snapshot of the others
                    if all(r.control >= version for r in fleet.members.values()):
                        return
                else:
                    await self._applied_event.wait()
        laggards = sorted(m for m, r in fleet.members.items() if r.control < version)
        if self.applied_version < version:
            laggards = sorted({*laggards, fleet.member_id})
        raise FleetLagging(version, laggards)

    # -- applying (every member) ----------------------------------------------------

    def heard(self, version: int) -> None:
        """A version was announced or seen in a heartbeat (0: no version stored):
        apply it if newer, or if older than the one applied (see :meth:`apply_current`)."""
        if version > self._wanted or version < self.applied_version:
            self._wanted = version
            self._wake.set()

    async def run(self) -> None:
        """Apply each newer state until cancelled (a Redis error retries next tick)."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self.apply_current()
            except STATE_ERRORS:
                self._wake.set()
                await self._fleet.wait_tick()

    async def apply_current(self) -> None:
        """Read the whole control state and apply what changed since last time.

        A stored version lower than the one applied means Redis lost the latest
        changes (a restart without persistence, a failover that lost the last
        writes): the member logs it and applies the state as Redis has it now, so
        every member and every joiner agree again and the next change (numbered
        from the stored version) is applied, not taken as already seen."""
        keys = self._keys
        async with self._fleet.redis.pipeline(transaction=False) as pipe:
            version_reply = pipe.get(keys.control("version"))
            paused_reply = pipe.hgetall(keys.control("paused"))
            engines_reply = pipe.hgetall(keys.control("engines"))
            adapters_reply = pipe.hgetall(keys.control("adapters"))
            weights_reply = pipe.get(keys.control("weight_version"))
            aborts_reply = pipe.lrange(keys.control("aborts"), 0, -1)
            confirms_reply = pipe.lrange(keys.control("confirms"), 0, -1)
            staleness_reply = pipe.hgetall(keys.control("staleness"))
        raw_version = await version_reply
        version = int(raw_version) if raw_version is not None else 0
        if version == self.applied_version and version:
            return
        if version < self.applied_version:
            log.warning(
                "fleet %s: control-plane version went back from %d to %d (the shared state "
                "lost changes); applying the state it holds now",
                self._fleet.settings.fleet_name, self.applied_version, version,
            )
        paused = _text(await paused_reply)
        engines = _text(await engines_reply)
        adapters = _text(await adapters_reply)
        weight_version = await weights_reply
        if weight_version is not None:  # recorded before any gate opens below
            text = weight_version.decode() if isinstance(weight_version, bytes) else weight_version
            self._client.weights.record_version(str(text))
        await self._apply(paused, engines, adapters)
        self._staleness.apply(_text(await staleness_reply))
        self._run_confirms([bytes(r) for r in await confirms_reply])
        await self._run_aborts([bytes(r) for r in await aborts_reply])
        self.applied_version = version
        self._applied_event.set()
        self._applied_event = trio.Event()

    async def _apply(
        self, paused: dict[str, str], engines: dict[str, str], adapters: dict[str, str]
    ) -> None:
        client = self._client
        known = {info.url for info in client.engines.list()}
        for url, op in engines.items():
            if op == "add" and url not in known:
                client.engines.add(url)
                self._fleet.leases.adopt(url)
        registry = client.adapters
        registered = registry.list()
        for name, value in adapters.items():
            if not value:
                if name in registered:
                    registry.unregister(name)
                continue
            record = orjson.loads(value)
            path, parent = record["path"], record["parent"]
            if registered.get(name) != path or registry.parent(name) != parent:
                registry.register(name, path, parent)
        known = {info.url for info in client.engines.list()}
        want_all = paused.get(ALL)
        want = {url: mode for url, mode in paused.items() if url != ALL and url in known}
        if want_all is not None and not self._paused_all:
            await client.pause(None, **fleet_pause_args(want_all))
        newly = [url for url in want if url not in self._paused]
        for mode in sorted({want[u] for u in newly}):  # "wait", "abort", "engine:keep", ...
            urls = [u for u in newly if want[u] == mode]
            await client.pause(urls, **fleet_pause_args(mode))
        if want_all is None and self._paused_all:
            await client.resume(None, call_engines=False)
            # resume(None) resumed every engine: pause again the ones still listed.
            if want:
                await client.pause(list(want), "wait")
        gone = [url for url in self._paused if url not in want and url in known]
        if gone and (want_all is None):
            await client.resume(gone, call_engines=False)
        self._paused_all = want_all is not None
        self._paused = set(want)
        for url, op in engines.items():
            if op == "remove" and url in known:
                client.engines.remove(url)

    def _run_confirms(self, records: list[bytes]) -> None:
        """Apply each version confirmation not applied here yet (after the recorded
        version and the engines, so the engine it names is known and held)."""
        engines = self._client.engines
        for raw in records:
            record = orjson.loads(raw)
            if record["id"] in self._confirms_run:
                continue
            self._confirms_run.append(record["id"])
            try:
                engine = engines.get(record["url"])
            except KeyError:
                continue  # removed since
            self._client.versions.confirm(engine, record["version"])

    async def _run_aborts(self, records: list[bytes]) -> None:
        """Run each abort record not run here yet, and write this member's counts
        beside it (kept 5 minutes) before the version counts as applied."""
        for raw in records:
            record = orjson.loads(raw)
            abort_id = record["id"]
            if abort_id in self._aborts_run:
                continue
            self._aborts_run.append(abort_id)
            counts = await self.abort_hook(record["ids"], record["group"], bool(record["all"]))
            key = self._keys.control(f"abort:{abort_id}")
            async with self._fleet.redis.pipeline(transaction=False) as pipe:
                pipe.hset(key, {self._fleet.member_id: orjson.dumps(counts).decode()})
                pipe.expire(key, 300)


def _engine_level(value: str) -> bool:
    """Whether a control-plane pause value paused the engines themselves."""
    return "engine_mode" in fleet_pause_args(value)


def _text(mapping: dict[Any, Any]) -> dict[str, str]:
    return {bytes(k).decode(): bytes(v).decode() for k, v in mapping.items()}
