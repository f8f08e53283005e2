"""Choosing an engine (docs/dispatch.md, "Engines, capacity and routing"). Pure functions over the engine list.

Engine fleets are small (tens), so each pick is one O(engines) pass; nothing here
looks at individual requests.

- ``least-outstanding``: the eligible engine with the fewest requests in flight
  plus queued on it; ties broken by a rotating offset so equal engines take
  turns instead of the first one absorbing every burst.
- ``round-robin``: the next eligible engine after the previous pick.
- ``session``: rendezvous (highest-random-weight) hashing of the session key
  (Thaler & Ravishankar, 1998): every engine gets a score ``mix(key, engine)``
  and the highest eligible score wins. Removing or pausing an engine only moves
  the sessions it owned, each to its next engine in hash order, so one session's
  requests keep hitting one engine's prefix cache. Bounded by the fleet's load,
  and a session moves off an overloaded or saturated engine
  (``_affinity.SessionAffinity``).
- ``prefix``: by the prompt's leading blocks, with bounded loads
  (``_prefix.PrefixRouter``); a request with a session key is routed as
  ``session``, one with no prompt to route by as ``least-outstanding``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import trio

if TYPE_CHECKING:
    from trioforward.dispatch.engines._affinity import SessionAffinity
    from trioforward.dispatch.engines._prefix import PrefixKey, PrefixRouter

__all__ = ["Routable", "Router", "stable_hash", "rendezvous_score"]

_MASK = (1 << 64) - 1


class Routable(Protocol):
    """What routing reads of an engine."""

    @property
    def eligible(self) -> bool: ...  # registered, healthy, not paused

    @property
    def outstanding(self) -> int: ...  # in flight + queued on it

    @property
    def seed(self) -> int: ...  # stable 64-bit hash of its URL

    @property
    def free_slot(self) -> bool: ...  # a request sent now runs without queueing

    @property
    def capacity(self) -> int: ...  # requests it runs at once (0 = unlimited)


def stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process (``hash()`` is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def rendezvous_score(key_hash: int, engine_seed: int) -> int:
    """splitmix64 finaliser of ``key ^ engine``: a well-mixed 64-bit score."""
    z = (key_hash ^ engine_seed) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


E = TypeVar("E", bound=Routable)


def _now() -> float:
    """trio's clock (a MockClock in tests); the monotonic clock outside a run."""
    try:
        return trio.current_time()
    except RuntimeError:
        return time.monotonic()


class Router:
    """Picks engines by ``policy`` (one of ``Settings.routing``'s values)."""

    __slots__ = ("policy", "_turn", "prefix", "sessions")

    def __init__(
        self,
        policy: str,
        *,
        prefix_load_factor: float = 1.25,
        prefix_table_size: int = 0,
        affinity_floor: int = 8,
        session_table_size: int = 65536,
        session_ttl: float = 600.0,
    ) -> None:
        if policy not in ("least-outstanding", "round-robin", "session", "prefix"):
            raise ValueError(f"unknown routing policy {policy!r}")
        self.policy = policy
        self._turn = 0
        self.prefix: PrefixRouter | None = None
        self.sessions: SessionAffinity | None = None
        if policy in ("session", "prefix"):
            from trioforward.dispatch.engines._affinity import SessionAffinity

            self.sessions = SessionAffinity(
                prefix_load_factor, floor=affinity_floor, size=session_table_size, ttl=session_ttl
            )
        if policy == "prefix":
            from trioforward.dispatch.engines._prefix import PrefixRouter

            self.prefix = PrefixRouter(prefix_load_factor, prefix_table_size, floor=affinity_floor)

    def pick(
        self,
        engines: Sequence[E],
        *,
        session: int | None = None,
        avoid: E | None = None,
        prefix: PrefixKey | None = None,
    ) -> E | None:
        """The engine for the next attempt, or ``None`` if none is eligible.

        ``session``: the request's session key hash (``stable_hash``), used by the
        ``session`` and ``prefix`` policies (the others ignore it; a request with
        no key is routed least-outstanding). ``prefix``: the prompt's
        :class:`~trioforward.dispatch.engines._prefix.PrefixKey`, used by the ``prefix``
        policy when there is no session key. ``avoid``: an engine that just
        failed; it is chosen only if it is the sole eligible one.
        """
        n = len(engines)
        if n == 0:
            return None
        if session is not None and self.sessions is not None:
            return self.sessions.pick(engines, session, avoid, _now())
        if prefix is not None and self.prefix is not None:
            return self.prefix.pick(engines, prefix, avoid)
        if self.policy == "round-robin":
            return self._round_robin(engines, avoid)
        return self._least_outstanding(engines, avoid)

    def _least_outstanding(self, engines: Sequence[E], avoid: E | None) -> E | None:
        n = len(engines)
        start = self._turn % n
        self._turn = start + 1
        best: E | None = None
        best_load = 0
        fallback: E | None = None
        for k in range(n):
            e = engines[(start + k) % n]
            if not e.eligible:
                continue
            if e is avoid:
                fallback = e
                continue
            load = e.outstanding
            if best is None or load < best_load:
                best, best_load = e, load
        return best if best is not None else fallback

    def _round_robin(self, engines: Sequence[E], avoid: E | None) -> E | None:
        n = len(engines)
        start = self._turn % n
        fallback: E | None = None
        for k in range(n):
            e = engines[(start + k) % n]
            if not e.eligible:
                continue
            if e is avoid:
                fallback = e
                continue
            self._turn = start + k + 1
            return e
        return fallback
