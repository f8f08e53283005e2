"""trioforward.fleet: many gateway processes acting as one, through Redis (docs/fleet.md).

Imported only when ``state_url`` is set (or ``workers > 1``): a single gateway
process never imports a Redis client. The fleet drives the dispatch core only
through its public API (``client.engines.set_share``, ``client.engines.list``,
``client.pause``/``resume``); nothing below this package knows Redis exists.

::

    async with open_client(engines=[...], settings=settings) as client:
        async with open_fleet(client, settings) as fleet:
            ...   # fleet.members, fleet.degraded, fleet.leases.applied
"""

from __future__ import annotations

from trioforward.fleet._control import ControlPlane, FleetLagging
from trioforward.fleet._futures import FutureExpired, SharedFutures, StateUnavailable
from trioforward.fleet._member import Fleet, MemberRecord, open_fleet
from trioforward.fleet._split import fair_split

__all__ = [
    "open_fleet",
    "Fleet",
    "MemberRecord",
    "fair_split",
    "SharedFutures",
    "StateUnavailable",
    "FutureExpired",
    "ControlPlane",
    "FleetLagging",
]
