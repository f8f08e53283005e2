"""This process as a member of a fleet: its id, its heartbeat, its view of the others.

Each tick one pipeline (one round trip) writes this member's record with a TTL
(its heartbeat, carrying its demand per engine), adds its id to the member set,
reads the set and reads the records of the members known from the last tick.
A member whose record expired is out of the fleet; its id is pruned from the
set on the next tick. A Redis outage marks the member *degraded* - logged once
per outage - and everything keeps running on the last snapshot.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from trioforward._settings import Settings, redact_url
from trioforward.fleet._leases import CapacityLeases
from trioforward.fleet._redis import STATE_ERRORS, Keys, open_redis

__all__ = ["Fleet", "MemberRecord", "open_fleet"]

log = logging.getLogger("trioforward.fleet")


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One live member as its last heartbeat described it: ``demand`` maps engine URL
    -> ``{"demand": queued + running, "held": ...}`` (see ``_leases``); ``share``
    maps engine URL -> the share its limiter held."""

    member_id: str
    host: str
    pid: int
    demand: dict[str, dict[str, int]]
    share: dict[str, int]


def new_member_id() -> str:
    """``host-pid-random``: unique in the fleet, and readable in ``/admin/engines``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Fleet:
    """This process's membership. Built by :func:`open_fleet`; read-only for routes.

    ``members``: member id -> :class:`MemberRecord` of every live member (this one
    included) at the last tick; ``degraded``: the shared state was unreachable at
    the last tick; ``leases``: the capacity leases (shares, demands).
    """

    def __init__(self, client: Any, settings: Settings, redis: Any, member_id: str) -> None:
        self.member_id = member_id
        self.settings = settings
        self.redis = redis
        self.keys = Keys(settings.fleet_name)
        self.leases = CapacityLeases(client.engines, settings.engine_capacity, member_id)
        self.members: dict[str, MemberRecord] = {}
        self.degraded = False
        self.ticks = 0
        self._known: set[str] = set()  # member ids read from the set last tick
        self._gone: set[str] = set()  # ids whose record had expired: pruned next tick
        self._ttl_ms = max(1, round((settings.member_ttl - settings.lease_interval) * 1000))
        self._host = socket.gethostname()
        self._tick_done: trio.Event = trio.Event()

    # -- the tick -----------------------------------------------------------------

    def _record(self) -> bytes:
        return orjson.dumps(
            {
                "host": self._host,
                "pid": os.getpid(),
                "demand": self.leases.demand(),
                "share": self.leases.applied,
            }
        )

    async def tick(self) -> bool:
        """One heartbeat and re-split. Returns False (and marks the member degraded)
        if the shared state did not answer within ``member_ttl``."""
        ok = False
        with trio.move_on_after(self.settings.member_ttl):
            try:
                await self._exchange()
                ok = True
            except STATE_ERRORS as exc:
                self._outage(exc)
        if not ok and not self.degraded:
            self._outage(TimeoutError(f"no answer within {self.settings.member_ttl} s"))
        if ok and self.degraded:
            self.degraded = False
            log.info("fleet %s: shared state reachable again", self.settings.fleet_name)
        self.ticks += 1
        self._tick_done.set()
        self._tick_done = trio.Event()
        return ok

    async def _exchange(self) -> None:
        keys = self.keys
        others = sorted(self._known - {self.member_id})
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.member(self.member_id), self._record(), px=self._ttl_ms)
            pipe.sadd(keys.members, [self.member_id])
            if self._gone:
                pipe.srem(keys.members, sorted(self._gone))
            members_reply = pipe.smembers(keys.members)
            records_reply = pipe.mget([keys.member(m) for m in others]) if others else None
        self._known = {m.decode() for m in await members_reply}
        raw = list(await records_reply) if records_reply is not None else []
        records = {self.member_id: self._own_record()}
        self._gone = set()
        for member_id, blob in zip(others, raw, strict=True):
            if blob is None:
                self._gone.add(member_id)
                continue
            data = orjson.loads(blob)
            records[member_id] = MemberRecord(
                member_id, data["host"], data["pid"], data["demand"], data["share"]
            )
        self.members = records
        self.leases.resplit({m: r.demand for m, r in records.items()})

    def _own_record(self) -> MemberRecord:
        return MemberRecord(
            self.member_id, self._host, os.getpid(), self.leases.demand(), dict(self.leases.applied)
        )

    def _outage(self, exc: BaseException) -> None:
        if self.degraded:
            return
        self.degraded = True
        log.warning(
            "fleet %s: shared state %s unreachable (%s); serving on the last shares, "
            "Tinker submits answer 503 until it returns",
            self.settings.fleet_name,
            redact_url(self.settings.state_url or ""),
            type(exc).__name__,
        )

    async def wait_tick(self) -> None:
        """Return after the next tick (tests and admin calls await this)."""
        await self._tick_done.wait()

    async def run(self) -> None:
        """Tick every ``lease_interval`` on a fixed schedule (a late tick is not
        made up twice) until cancelled."""
        interval = self.settings.lease_interval
        deadline = trio.current_time()
        while True:
            deadline = max(deadline + interval, trio.current_time())
            await trio.sleep_until(deadline)
            await self.tick()

    async def leave(self) -> None:
        """Delete this member's record so its shares return at once (not after
        ``member_ttl``). Best effort, bounded: a crash gets the TTL instead."""
        with trio.move_on_after(self.settings.member_ttl) as scope:
            scope.shield = True
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.delete([self.keys.member(self.member_id)])
                    pipe.srem(self.keys.members, [self.member_id])
            except STATE_ERRORS:
                pass


@asynccontextmanager
async def open_fleet(
    client: Any, settings: Settings, *, member_id: str | None = None
) -> AsyncIterator[Fleet]:
    """Join the fleet named by ``settings.state_url`` and ``settings.fleet_name``
    with the dispatch ``client``; leave at exit.

    Before yielding, every engine's share is set to 1 and one tick is tried, so
    the member takes traffic with a computed share (or, if the shared state is
    unreachable now, with a share of 1 and ``degraded`` set: it never blocks).
    """
    if settings.state_url is None:
        raise ValueError("open_fleet needs settings.state_url")
    async with open_redis(settings.state_url, reply_timeout=settings.member_ttl) as redis:
        fleet = Fleet(client, settings, redis, member_id or new_member_id())
        fleet.leases.start()
        await fleet.tick()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fleet.run)
            try:
                yield fleet
            finally:
                nursery.cancel_scope.cancel()
                await fleet.leave()
