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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import trio
from coredis.retry import NoRetryPolicy

from trioforward._settings import Settings
from trioforward._state_url import redact_url
from trioforward.fleet._control import ControlPlane
from trioforward.fleet._futures import SharedFutures
from trioforward.fleet._leases import CapacityLeases
from trioforward.fleet._redis import STATE_ERRORS, Keys, open_redis
from trioforward.fleet._sessions import FleetSessions

__all__ = ["Fleet", "MemberRecord", "open_fleet"]

log = logging.getLogger("trioforward.fleet")


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One live member as its last heartbeat described it: ``demand`` maps engine URL
    -> ``{"demand": queued + running, "held": ...}`` (see ``_leases``); ``share``
    maps engine URL -> the share its limiter held; ``epoch`` names the Tinker
    futures it issued (``tf-<epoch>-<n>``); ``outstanding``: its unfinished samples;
    ``control``: the control-plane version it applied."""

    member_id: str
    host: str
    pid: int
    demand: dict[str, dict[str, int]]
    share: dict[str, int]
    epoch: str = ""
    outstanding: int = 0
    control: int = 0


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
        # Agent sessions live in the state store in fleet mode (docs/sessions.md).
        self.sessions = FleetSessions(redis, self.keys)
        self.leases = CapacityLeases(client.engines, settings.engine_capacity, member_id)
        self.members: dict[str, MemberRecord] = {}
        self.epoch = secrets.token_hex(4)  # names this member's Tinker future ids
        # Unfinished Tinker samples here; set by the Tinker routes (fleet-wide max_outstanding).
        self.outstanding: Callable[[], int] = lambda: 0
        self.futures = SharedFutures(self)
        self.control = ControlPlane(self, client)
        self.degraded = False
        self.ticks = 0
        self.longest_gap = 0.0  # longest time between two successful writes (s)
        self.late_heartbeats = 0  # writes later than the record's TTL
        self._last_write = trio.current_time()
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
                "epoch": self.epoch,
                "outstanding": self.outstanding(),
                "control": self.control.applied_version,
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
                now = trio.current_time()
                gap = now - self._last_write
                self.longest_gap = max(self.longest_gap, gap)
                self._last_write = now
                if gap > self.settings.member_ttl - self.settings.lease_interval and not self.degraded:
                    self._late(gap)
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
        # The set is for discovery; a member stays in view while its record lives,
        # even if another member's prune raced its re-add after an outage.
        others = sorted((self._known | set(self.members)) - {self.member_id})
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.member(self.member_id), self._record(), px=self._ttl_ms)
            pipe.sadd(keys.members, [self.member_id])
            if self._gone:
                pipe.srem(keys.members, sorted(self._gone))
            members_reply = pipe.smembers(keys.members)
            version_reply = pipe.get(keys.control("version"))
            records_reply = pipe.mget([keys.member(m) for m in others]) if others else None
        self._known = {m.decode() for m in await members_reply}
        version = await version_reply
        self.control.heard(int(version) if version is not None else 0)
        raw = list(await records_reply) if records_reply is not None else []
        records = {self.member_id: self._own_record()}
        self._gone = set()
        for member_id, blob in zip(others, raw, strict=True):
            if blob is None:
                self._gone.add(member_id)
                continue
            data = orjson.loads(blob)
            records[member_id] = MemberRecord(
                member_id,
                data["host"],
                data["pid"],
                data["demand"],
                data["share"],
                data.get("epoch", ""),
                data.get("outstanding", 0),
                data.get("control", 0),
            )
        self.members = records
        self.leases.resplit({m: r.demand for m, r in records.items()})

    def _own_record(self) -> MemberRecord:
        return MemberRecord(
            self.member_id,
            self._host,
            os.getpid(),
            self.leases.demand(),
            dict(self.leases.applied),
            self.epoch,
            self.outstanding(),
            self.control.applied_version,
        )

    def summary(self) -> dict[str, Any]:
        """For ``/health`` and ``/admin/engines``: this member, the shared state's
        reachability, per engine the fleet's totals (demand, shares, members using
        it) and every live member's demand and share per engine."""
        totals: dict[str, dict[str, int]] = {}
        for record in self.members.values():
            for url, counts in record.demand.items():
                total = totals.setdefault(url, {"demand": 0, "share": 0, "members": 0})
                total["demand"] += int(counts["demand"])
                total["share"] += int(record.share.get(url, 0))
                total["members"] += 1
        return {
            "name": self.settings.fleet_name,
            "member": self.member_id,
            "state": "unreachable" if self.degraded else "ok",
            "control_version": self.control.applied_version,
            "engines": totals,
            "members": {
                m: {
                    "host": r.host,
                    "pid": r.pid,
                    "demand": r.demand,
                    "share": r.share,
                    "outstanding_samples": r.outstanding,
                    "control_version": r.control,
                }
                for m, r in sorted(self.members.items())
            },
        }

    def epoch_alive(self, epoch: str) -> bool:
        """Whether a live member issues futures under ``epoch`` (as of the last tick)."""
        return epoch == self.epoch or any(r.epoch == epoch for r in self.members.values())

    def others_outstanding(self) -> int:
        """Unfinished Tinker samples on the other live members (as of the last tick)."""
        return sum(r.outstanding for m, r in self.members.items() if m != self.member_id)

    async def listen(self) -> None:
        """Follow the completion and announce channels (one subscription) until
        cancelled. When the subscription breaks (a Redis outage, a Sentinel
        failover) it subscribes again a tick later and wakes every held poll to
        read its result once more, since a notice published in between is lost."""
        channels = [self.keys.done, self.keys.announce]
        while True:
            try:
                # No retry inside coredis (it backs off up to 16 s): this loop retries.
                async with self.redis.pubsub(channels=channels, retry_policy=NoRetryPolicy()) as pubsub:
                    self.futures.recheck_all()
                    async for message in pubsub:
                        if message["type"] != "message":
                            continue
                        if message["channel"] == self.keys.announce.encode():
                            self.control.heard(int(message["data"]))
                        else:
                            self.futures.notice(message["data"])
            except* STATE_ERRORS:  # coredis raises them inside exception groups
                pass
            await trio.sleep(self.settings.lease_interval)

    def _late(self, gap: float) -> None:
        # The others may have dropped this member from their splits meanwhile
        # and raised their shares while its requests still ran: the capacity
        # invariant does not hold through such a stall (docs/fleet.md).
        self.late_heartbeats += 1
        if self.late_heartbeats == 1:
            log.warning(
                "fleet %s: heartbeat %.2f s late (member_ttl %.2f s): raise member_ttl above "
                "the longest event-loop stall, or engine capacity may be overshot",
                self.settings.fleet_name,
                gap,
                self.settings.member_ttl,
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

    Before yielding, every engine's share is set to 1, the control plane's
    current state (pause, engines, adapters) is applied and two ticks are tried, so the
    member takes traffic with a computed share and the fleet's state (or, if the
    shared state is unreachable now, with a share of 1 and ``degraded`` set: it
    never blocks longer than ``member_ttl`` per step).
    """
    if settings.state_url is None:
        raise ValueError("open_fleet needs settings.state_url")
    async with open_redis(settings.state_url, reply_timeout=settings.member_ttl) as redis:
        fleet = Fleet(client, settings, redis, member_id or new_member_id())
        fleet.leases.start()
        # Join: apply the fleet's pause state, engines and adapters before traffic.
        with trio.move_on_after(settings.member_ttl):
            try:
                await fleet.control.apply_current()
            except STATE_ERRORS:
                pass  # the control task applies it once Redis answers
        # Two ticks: the first writes this record and learns who the others are,
        # the second reads their records (one round trip each).
        if await fleet.tick():
            await fleet.tick()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fleet.run)
            nursery.start_soon(fleet.listen)
            nursery.start_soon(fleet.futures.run)
            nursery.start_soon(fleet.futures.run_claims)
            nursery.start_soon(fleet.control.run)
            try:
                yield fleet
            finally:
                nursery.cancel_scope.cancel()
                await fleet.leave()
