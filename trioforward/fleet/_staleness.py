"""Staleness bounds in a fleet: applied by every member, started rollouts counted once.

docs/operations.md, "Staleness-bounded admission"; docs/fleet.md, "Control
plane". A declaration is a control-plane record (``staleness`` hash: scope key
-> the bound as JSON with a fresh id, ``""`` withdraws it) that every member
applies as it applies the rest of the control state. Its started rollouts are
one Redis counter per declaration id (``control:started:<id>``): each member's
dispatch gate takes a start from it (:meth:`SharedStaleness.take`), so
``(i + eta + 1) x step`` holds across the members, not per member.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from trioforward.dispatch import StalenessBound
from trioforward.fleet._redis import STATE_ERRORS

if TYPE_CHECKING:
    from trioforward.fleet._member import Fleet

__all__ = ["SharedStaleness", "STARTED_TTL", "declaration", "withdrawal"]

log = logging.getLogger("trioforward.fleet")

#: Seconds a declaration's started count is kept after its first start.
STARTED_TTL = 7 * 24 * 3600


def declaration(bound: StalenessBound) -> dict[str, str]:
    """The ``staleness`` hash field that declares ``bound`` on every member: a fresh
    id, so its started count begins at 0."""
    return {bound.key: orjson.dumps({**bound.to_json(), "id": uuid.uuid4().hex}).decode()}


def withdrawal(tenant: str | None, group_prefix: str | None) -> dict[str, str]:
    """The ``staleness`` hash field that withdraws the bound of ``tenant`` or
    ``group_prefix`` (its scope key, as :attr:`StalenessBound.key` names it)."""
    return {f"tenant:{tenant}" if tenant is not None else f"group:{group_prefix}": ""}


class SharedStaleness:
    """One member's staleness bounds: the fleet's count of their starts (the
    dispatch client's ``admission.shared``) and the records it applied."""

    def __init__(self, fleet: Fleet, client: Any) -> None:
        self._fleet = fleet
        self._client = client
        self._applied: dict[str, str] = {}  # scope key -> the declaration id applied
        client.admission.shared = self

    async def take(self, bound: StalenessBound, allowed: int) -> bool:
        """Count one more started rollout of ``bound`` in the fleet if fewer than
        ``allowed`` started (True). INCR then DECR when over: a start racing on
        another member may push the count over for a moment, so a refusal is
        final only when the count, once given back, still holds ``allowed``.
        While the state store does not answer, nothing starts (False: the
        rollout waits, never beyond the bound; the next resume tries again)."""
        key = self._fleet.keys.control(f"started:{bound.id}")
        redis = self._fleet.redis
        try:
            while True:
                taken = await redis.incr(key)
                if taken == 1:
                    await redis.expire(key, STARTED_TTL)
                if taken <= allowed:
                    return True
                if await redis.decr(key) >= allowed:
                    return False
        except STATE_ERRORS as exc:
            log.warning("fleet: staleness bound %s: no start counted (%s); it waits", bound.key, exc)
            return False

    async def give_back(self, bound: StalenessBound) -> None:
        """Give back one start taken for a request that left before it started (a
        state store that does not answer keeps it: the bound only gets stricter)."""
        try:
            await self._fleet.redis.decr(self._fleet.keys.control(f"started:{bound.id}"))
        except STATE_ERRORS as exc:
            log.warning("fleet: staleness bound %s: a start not given back (%s)", bound.key, exc)

    def apply(self, records: dict[str, str]) -> None:
        """Declare the bounds new (or re-declared) since last time, withdraw the
        withdrawn ones. A member counts versions from when it applied one, so a
        member that joins later is stricter, never looser."""
        admission = self._client.admission
        for scope, value in records.items():
            applied = self._applied.get(scope)
            if not value:
                if applied is not None:
                    del self._applied[scope]
                    kind, _, name = scope.partition(":")
                    admission.withdraw(*((name, None) if kind == "tenant" else (None, name)))
                continue
            record = orjson.loads(value)
            if record["id"] == applied:
                continue
            self._applied[scope] = record["id"]
            admission.declare(StalenessBound(**record))
