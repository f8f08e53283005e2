"""Tenants: who a request is for, their share of the engines and their counters
(docs/dispatch.md, "Tenants and fair queueing").

A :class:`Tenant` is one row of the tenant table (``Settings.tenants``), or the
tenant of one bare API key, or the single tenant of a gateway without keys. The
engine queues (``_fair.py``) order requests by tenant; the dispatcher admits
them against each tenant's ``max_outstanding`` and counts per tenant what the
metrics report. Counters are plain integers mutated by trio tasks (no locks).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from trioforward import Settings
from trioforward.errors import QueueFull, TenantQueueFull

__all__ = ["Tenant", "TenantStatistics", "TenantTable", "refusal", "QUEUE_TIME_BUCKETS", "DEFAULT_TENANT"]

#: The tenant of every request when no API key is configured, and of embedded
#: calls that name none.
DEFAULT_TENANT = "default"

#: Upper bounds (s) of the per-tenant queue-time histogram (the gateway's
#: ``trioforward_queue_wait_seconds`` buckets).
QUEUE_TIME_BUCKETS = (0.001, 0.005, 0.02, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200)


@dataclass(frozen=True, slots=True)
class TenantStatistics:
    """One tenant's counters (``client.statistics().tenants[name]``).

    ``queued``/``in_flight``: requests waiting for / holding engine capacity now;
    ``outstanding``: requests admitted and not yet answered; ``served``: requests
    that reached an engine and ended (answered or failed there); ``rejections``:
    requests refused at admission (``tenant_queue_full``); ``queue_time_buckets``:
    cumulative counts per bound of :data:`QUEUE_TIME_BUCKETS` then ``+Inf``, of
    each request's total queue time (s), ``queue_time_sum`` their sum (s).
    """

    name: str
    weight: float
    priority: int
    max_outstanding: int
    outstanding: int
    queued: int
    in_flight: int
    served: int
    rejections: int
    queue_time_buckets: tuple[int, ...]
    queue_time_sum: float


class Tenant:
    """One tenant: ``weight`` (> 0, its share among backlogged tenants of its
    class), ``priority`` (a higher class is served first), ``max_outstanding``
    (requests admitted at once; 0 = unlimited) and its counters. Hashed by identity."""

    __slots__ = (
        "name",
        "weight",
        "priority",
        "max_outstanding",
        "outstanding",
        "queued",
        "in_flight",
        "served",
        "rejections",
        "samples",
        "_buckets",
        "queue_time_sum",
    )

    def __init__(self, name: str, weight: float = 1.0, priority: int = 0, max_outstanding: int = 0) -> None:
        self.name = name
        self.weight = weight
        self.priority = priority
        self.max_outstanding = max_outstanding
        self.outstanding = 0
        self.queued = 0
        self.in_flight = 0
        self.served = 0
        self.rejections = 0
        self.samples = 0  # unfinished Tinker samples (the gateway's sample runner)
        self._buckets = [0] * (len(QUEUE_TIME_BUCKETS) + 1)
        self.queue_time_sum = 0.0

    def __repr__(self) -> str:
        return f"Tenant({self.name!r}, weight={self.weight}, priority={self.priority})"

    def refusal(self, count: int, what: str) -> TenantQueueFull:
        """The refusal of one more request (or Tinker sample: ``what``) of this
        tenant, which has ``count`` outstanding; counted in its ``rejections``."""
        self.rejections += 1
        return TenantQueueFull(
            f"tenant {self.name!r} has {count} {what} outstanding (its max_outstanding is"
            f" {self.max_outstanding})",
            tenant=self.name,
            outstanding=count,
        )

    def observe_queue_time(self, seconds: float) -> None:
        self._buckets[bisect.bisect_left(QUEUE_TIME_BUCKETS, seconds)] += 1
        self.queue_time_sum += seconds

    def statistics(self) -> TenantStatistics:
        running = 0
        cumulative = []
        for count in self._buckets:
            running += count
            cumulative.append(running)
        return TenantStatistics(
            self.name,
            self.weight,
            self.priority,
            self.max_outstanding,
            self.outstanding,
            self.queued,
            self.in_flight,
            self.served,
            self.rejections,
            tuple(cumulative),
            self.queue_time_sum,
        )


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class TenantTable:
    """Every tenant of one client, and which API key belongs to which.

    From ``settings.tenants`` (name -> keys, weight, priority, max_outstanding)
    and ``settings.api_keys``: a key listed only in ``api_keys`` is a tenant of
    its own, named ``key-N`` (N its 1-based place in ``api_keys``: the key
    itself is never a name, so it never reaches a log or ``/metrics``). With no
    key at all, requests go to :attr:`default` (``default_tenant``, a row of the
    table or a tenant of weight 1).

    Keys are looked up by their SHA-256 digest: one hash and one dict probe per
    request, in a time that does not depend on how much of a key matched.
    """

    __slots__ = ("by_name", "_by_digest", "default", "keys")

    def __init__(self, settings: Settings) -> None:
        self.by_name: dict[str, Tenant] = {}
        self._by_digest: dict[bytes, Tenant] = {}
        for name, spec in settings.tenants.items():
            tenant = self.by_name[name] = Tenant(name, spec.weight, spec.priority, spec.max_outstanding)
            for key in spec.keys:
                self._by_digest[_digest(key)] = tenant
        for i, key in enumerate(settings.api_keys, 1):
            digest = _digest(key)
            if digest not in self._by_digest:
                name = f"key-{i}"
                self._by_digest[digest] = self.by_name.setdefault(name, Tenant(name))
        name = settings.default_tenant
        self.default = self.by_name.get(name) or self.by_name.setdefault(name, Tenant(name))
        #: Whether any key is configured (else every request is the default tenant's).
        self.keys = bool(self._by_digest)

    def for_key(self, key: str | None) -> Tenant | None:
        """The tenant of API key ``key``, or ``None`` for a missing or unknown key."""
        if not key:
            return None
        return self._by_digest.get(_digest(key))

    def named(self, name: str | None) -> Tenant:
        """The tenant called ``name`` (``None``: the default). Raises ``ValueError``
        naming the known tenants for any other name (the label set of the
        metrics is the table's)."""
        if name is None:
            return self.default
        tenant = self.by_name.get(name)
        if tenant is None:
            known = ", ".join(sorted(self.by_name))
            raise ValueError(f"unknown tenant {name!r}: the tenants are {known} (the tenants knob)")
        return tenant

    def __iter__(self) -> Iterator[Tenant]:
        return iter(self.by_name.values())


def refusal(tenant: Tenant, outstanding: int, max_outstanding: int) -> QueueFull | None:
    """Admission of one request of ``tenant`` while ``outstanding`` requests are
    (``max_outstanding`` the client's bound; 0 = none): ``None`` to admit it, else
    the error to raise — :class:`TenantQueueFull` at the tenant's own bound, first,
    then :class:`QueueFull` — counted in the tenant's ``rejections``. Nothing is
    held yet when it is refused."""
    limit = tenant.max_outstanding
    if limit and tenant.outstanding >= limit:
        return tenant.refusal(tenant.outstanding, "requests")
    if max_outstanding and outstanding >= max_outstanding:
        tenant.rejections += 1
        return QueueFull(f"more than {max_outstanding} requests outstanding (max_outstanding)")
    return None
