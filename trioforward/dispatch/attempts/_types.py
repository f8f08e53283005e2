"""Value objects the client returns: responses and statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from trioforward.dispatch.engines._tenants import TenantStatistics
from trioforward.http import PoolStatistics

__all__ = ["ForwardResponse", "ClientStatistics"]


@dataclass(slots=True)
class ForwardResponse:
    """The engine's answer to one forwarded request, whatever its status.

    ``headers``: lower-case ``(name, value)`` bytes pairs, hop-by-hop ones
    removed; ``content``: the whole body; ``engine``: the base URL of the engine
    that answered; ``attempts``: upstream attempts made (>= 1); ``queue_time``:
    seconds in ``QUEUED``; ``engine_time``: seconds from dispatch (capacity
    acquired) to the complete answer, summed over engines; ``retries``: the
    ``(phase, reason)`` of each retry, in order; ``weight_version``: the weight
    version that produced it (``"a, b"`` when a keep pause spanned an update;
    ``None`` before any version was recorded; docs/operations.md);
    ``request_id``: the request's id, the caller's or the gateway's
    (docs/server.md, "Request ids and rollout groups"); ``staleness``: versions
    the weights that ended it are behind the current ones when it ended
    (``None`` before any version was recorded; docs/operations.md, "Which
    weights a request accepts"); ``admission_time``: seconds it waited at a
    staleness bound before it started (not in ``queue_time``;
    docs/operations.md, "Staleness-bounded admission").
    """

    status: int
    headers: list[tuple[bytes, bytes]]
    content: bytes
    engine: str
    attempts: int
    queue_time: float
    engine_time: float
    retries: tuple[tuple[str, str], ...] = ()
    weight_version: str | None = None
    request_id: str = ""
    staleness: int | None = None
    admission_time: float = 0.0

    def json(self) -> Any:
        """The body parsed with orjson (raises ``orjson.JSONDecodeError``)."""
        return orjson.loads(self.content)

    def header(self, name: bytes, default: bytes | None = None) -> bytes | None:
        """The first value of header ``name`` (lower-case bytes)."""
        for key, value in self.headers:
            if key == name:
                return value
        return default


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """A snapshot of ``client.statistics()``.

    ``requests_total``: requests accepted since the client opened;
    ``in_flight``: dispatched now (holding engine capacity); ``queued``: waiting
    in ``QUEUED`` now; ``retries``: count by ``(phase, reason)``; ``responses``:
    engine answers (every attempt) by ``(engine URL, status)``;
    ``adapter_loads`` / ``adapter_unloads``: by engine URL (not by adapter: a run
    makes one per step); ``adapters_loaded``: engine URL -> the adapters the
    gateway keeps loaded there (least recently used first, at most
    ``max_loaded_adapters``); ``adapters_registered``: how many are registered; ``pool``:
    the forwarding pool's own statistics; ``tenants``: tenant name ->
    :class:`~trioforward.dispatch.TenantStatistics` (every tenant of the table);
    ``session_moves``: sessions routing moved off an overloaded or saturated
    engine; ``sessions_routed``: sessions whose engine routing remembers now
    (docs/dispatch.md, "Sessions that move");
    ``migrations``: generations moved to another engine after theirs failed
    mid-answer, by ``(route, reason)`` (docs/operations.md, "Migration").
    """

    requests_total: int
    in_flight: int
    queued: int
    retries: dict[tuple[str, str], int]
    responses: dict[tuple[str, int], int]
    adapter_loads: dict[str, int]
    adapter_unloads: dict[str, int]
    adapters_loaded: dict[str, list[str]]
    adapters_registered: int
    pool: PoolStatistics
    tenants: dict[str, TenantStatistics] = field(default_factory=dict)
    session_moves: int = 0
    sessions_routed: int = 0
    migrations: dict[tuple[str, str], int] = field(default_factory=dict)
