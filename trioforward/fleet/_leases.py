"""Capacity leases: this member's demand out, everyone's demand in, its share applied.

The Doorman pattern (Google, "Doorman: global distributed client-side rate
limiting"), without a server: each tick a member publishes its demand per
engine (requests queued + running here) inside its heartbeat record, reads the
records of every live member, computes :func:`~trioforward.fleet._split.fair_split`
and sets its local limiter to its share through the dispatch core's public
``client.engines.set_share``. Nothing on the request path waits for any of this.

The invariant (docs/fleet.md, "Capacity leases"). Each member's record carries,
per engine, its *held* count: the largest of the share it intends to apply
next, the share its limiter holds and the requests running there. A member
applies ``max(1, min(intended, intended_last_tick, headroom))`` where
``headroom = engine_capacity - sum of the other live members' held counts``.

1. Shares computed from one snapshot sum to exactly ``engine_capacity`` (as
   long as the members using the engine are at most ``engine_capacity``).
2. A share is published (as intended) one tick before it is applied, and every
   tick writes before it reads in one pipeline, which Redis runs in order. Of
   two members raising at once, the later reader sees the earlier one's
   intention and leaves room for it; a member that lowered its share keeps its
   running requests (never cancelled) and publishes them as held, so nobody
   raises into capacity still in use.
3. Hence the requests running on an engine across the fleet stay at or below
   ``engine_capacity``, with two exceptions, both bounded: the floor of one
   (a limiter cannot hold 0 tokens) - a member whose headroom is 0 still holds
   1, at most ``members - 1`` extra, only while another member drains requests
   it started under a larger share; and a member joining holds 1 before its
   first heartbeat is read, at most 1 extra per member joining, for one tick.
4. A member whose record expired (``member_ttl``, its last write plus
   ``member_ttl - lease_interval``) leaves every split at the next tick of each
   member, so its share is back within ``member_ttl``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trioforward.fleet._split import fair_split

__all__ = ["CapacityLeases"]


class CapacityLeases:
    """One member's side of the leases for every engine of its dispatch client.

    ``engines`` is the dispatch client's ``client.engines`` (its public API);
    ``capacity`` is ``engine_capacity`` (0 = unlimited: nothing is split).
    """

    __slots__ = ("_engines", "_capacity", "_member_id", "_computed", "applied", "demand_of")

    def __init__(self, engines: Any, capacity: int, member_id: str) -> None:
        self._engines = engines
        self._capacity = capacity
        self._member_id = member_id
        self._computed: dict[str, int] = {}  # last tick's computed share, per engine URL
        self.applied: dict[str, int] = {}  # the share the limiter holds now
        # engine URL -> member id -> demand, from the last snapshot (for /admin and metrics)
        self.demand_of: dict[str, dict[str, int]] = {}

    @property
    def enabled(self) -> bool:
        return self._capacity > 0

    def start(self) -> None:
        """Before the first snapshot: hold a share of 1 on every engine (a join
        overshoots by at most that, for one tick)."""
        if not self.enabled:
            return
        for info in self._engines.list():
            self._engines.set_share(info.url, 1)
            self.applied[info.url] = 1

    def adopt(self, url: str) -> None:
        """An engine was just added here: hold a share of 1 on it until the next
        split (as at a join), not its whole capacity."""
        if self.enabled:
            self._engines.set_share(url, 1)
            self.applied[url] = 1

    def demand(self) -> dict[str, dict[str, int]]:
        """This member's published counts per engine URL: ``demand`` (queued +
        running here) and ``held`` (max of intended share, applied share and running)."""
        out: dict[str, dict[str, int]] = {}
        for info in self._engines.list():
            held = max(self._computed.get(info.url, 1), self.applied.get(info.url, 1), info.in_flight)
            out[info.url] = {"demand": info.in_flight + info.queued, "held": held}
        return out

    def resplit(self, records: Mapping[str, Mapping[str, Mapping[str, int]]]) -> None:
        """Apply this member's share from ``records``: member id -> engine URL ->
        ``{"demand", "held"}`` (every live member, this one included, as
        :meth:`demand` publishes it). Engines this member does not know are
        ignored; members not listing an engine are not in its split.
        """
        if not self.enabled:
            return
        demand_of: dict[str, dict[str, int]] = {}
        held_elsewhere: dict[str, int] = {}
        for member, per_engine in records.items():
            for url, counts in per_engine.items():
                demand_of.setdefault(url, {})[member] = int(counts["demand"])
                if member != self._member_id:
                    held_elsewhere[url] = held_elsewhere.get(url, 0) + int(counts["held"])
        self.demand_of = demand_of
        computed: dict[str, int] = {}
        for info in self._engines.list():
            url = info.url
            split = fair_split(self._capacity, demand_of.get(url, {self._member_id: 0}))
            share = computed[url] = split.get(self._member_id, 1)
            headroom = self._capacity - held_elsewhere.get(url, 0)
            apply = max(1, min(share, self._computed.get(url, 1), headroom))
            if self.applied.get(url) != apply:
                self._engines.set_share(url, apply)
                self.applied[url] = apply
        self._computed = computed
        for url in [u for u in self.applied if u not in computed]:
            del self.applied[url]  # engine removed here
