"""Affinity bounded by the fleet: the load bound prefix and session routing share,
and the session table (docs/dispatch.md, "Sessions that move").

**The bound** (consistent hashing with bounded loads: Mirrokni, Thorup &
Zadimoghaddam, SODA 2018, arXiv 1608.01350). An engine has *room* while its
load (``outstanding``: queued here, plus the larger of this process's in-flight
count and what the engine itself reported) is below
``ceil(factor × (m + 1) / n)`` (``m`` the eligible engines' load, ``n`` their
number), or — the *floor*, with a known capacity — while it has a free slot
and a load below ``floor``: at low load a conversation keeps its engine
though the mean is tiny, and a hot prefix still spreads once its engine runs
``floor`` requests and more than ``factor`` times its share.

**Sessions** (``routing = "session"``, or a session key under ``prefix``): a
session's first request goes to the first engine in its rendezvous order with
room; the table remembers it. Later requests stay there unless the engine left
(ineligible, or the request must avoid it), or it is *overloaded*: no room
under the wider bound ``move_factor`` (1.5 × 1.25: placement at 1.25, a move
only past 1.5 — hysteresis, so a session does not flap at the edge), or
``saturated`` (it preempts or queues, by its own load reports, itself with
hysteresis: ``_adaptive.py``) while another engine is neither and has room.
A move is counted (``moves``). The table holds at most ``size`` sessions,
least recently used dropped first, and forgets a session unused for ``ttl``
seconds; :meth:`SessionAffinity.finish` ends one at once.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import TypeVar

from trioforward.dispatch.engines._routing import Routable, rendezvous_score

__all__ = ["SessionAffinity", "bounded_choice", "has_room", "load_bound", "FLOOR"]

#: Requests an engine with a free slot keeps taking for its affinity, however
#: low the fleet's mean (``affinity_floor``).
FLOOR = 8
#: How much wider than the placement bound a session's engine may be loaded
#: before the session moves.
MOVE_MARGIN = 1.2

E = TypeVar("E", bound=Routable)


def load_bound(engines: Sequence[Routable], factor: float) -> int:
    """``ceil(factor × (m + 1) / n)`` over the eligible engines (0 with none)."""
    total = 0
    n = 0
    for e in engines:
        if e.eligible:
            total += e.outstanding
            n += 1
    return math.ceil(factor * (total + 1) / n) if n else 0


def has_room(engine: Routable, room: int, floor: int) -> bool:
    """Whether ``engine`` may take a request for its affinity: a load below the
    bound ``room``, or (a known capacity) a free slot and a load below ``floor``."""
    load = engine.outstanding
    return load < room or (engine.capacity > 0 and load < floor and engine.free_slot)


def _home(engines: Sequence[E], key: int, avoid: E | None) -> E | None:
    """The first eligible engine in ``key``'s rendezvous order (``avoid`` only alone)."""
    best: E | None = None
    best_score = -1
    fallback: E | None = None
    for e in engines:
        if not e.eligible:
            continue
        if e is avoid:
            fallback = e
            continue
        score = rendezvous_score(key, e.seed)
        if score > best_score:
            best, best_score = e, score
    return best if best is not None else fallback


def bounded_choice(engines: Sequence[E], key: int, avoid: E | None, room: int, floor: int) -> E | None:
    """The first engine in ``key``'s rendezvous order with room; else the least
    loaded other one; ``avoid`` (it just failed) only when it is alone."""
    ranked = sorted(
        (e for e in engines if e.eligible), key=lambda e: rendezvous_score(key, e.seed), reverse=True
    )
    fallback: E | None = None
    for e in ranked:
        if e is avoid:
            fallback = e
        elif has_room(e, room, floor):
            return e
    others = [e for e in ranked if e is not avoid]
    if others:
        return min(others, key=lambda e: e.outstanding)
    return fallback


class SessionAffinity:
    """Session key hash -> engine, bounded (``size``) and expiring (``ttl`` s)."""

    __slots__ = ("factor", "floor", "size", "ttl", "moves", "_table")

    def __init__(self, factor: float, *, floor: int = FLOOR, size: int = 65536, ttl: float = 600.0) -> None:
        self.factor = factor
        self.floor = floor
        self.size = size
        self.ttl = ttl
        self.moves = 0  # sessions moved off an overloaded or saturated engine
        # key -> [engine, last use (trio time), pinned off its home], least recently used first
        self._table: OrderedDict[int, list[object]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def finish(self, key: int) -> bool:
        """Forget session ``key`` (its next request is placed afresh); whether it was known."""
        return self._table.pop(key, None) is not None

    def pick(self, engines: Sequence[E], key: int, avoid: E | None, now: float) -> E | None:
        """The engine for the next request of session ``key`` at time ``now``.

        A session placed or moved off its *home* (the first eligible engine in
        its rendezvous order) is pinned where it went; the others follow their
        home, as pure rendezvous hashing does (a paused home's sessions come
        back when it resumes)."""
        self._expire(now)
        entry = self._table.get(key)
        moved = False  # leaves its engine for load, not because the engine left
        if entry is not None and entry[2]:
            pinned: E = entry[0]  # type: ignore[assignment]
            if pinned.eligible and pinned is not avoid and pinned in engines:
                if not self._overloaded(pinned, engines):
                    self._touch(key, pinned, now, True)
                    return pinned
                moved = True
        home = _home(engines, key, avoid)
        if home is None:
            return None
        room = load_bound(engines, self.factor)
        if entry is None:  # a new session: the first engine in its order with room
            chosen = bounded_choice(engines, key, avoid, room, self.floor)
        elif not self._overloaded(home, engines):
            chosen = home
        else:  # off its overloaded or saturated home, to an engine that is neither
            moved = moved or entry[0] is home
            others = [e for e in engines if e is not home and not getattr(e, "saturated", False)]
            chosen = bounded_choice(others, key, avoid, room, self.floor) or home
        if chosen is None:
            return None
        if moved and chosen is not entry[0]:  # type: ignore[index]
            self.moves += 1
        self._touch(key, chosen, now, chosen is not home)
        return chosen

    def _overloaded(self, engine: Routable, engines: Sequence[Routable]) -> bool:
        wide = load_bound(engines, self.factor * MOVE_MARGIN)
        if not has_room(engine, wide, self.floor):
            return True
        if not getattr(engine, "saturated", False):
            return False
        room = load_bound(engines, self.factor)
        return any(
            e is not engine and e.eligible and not getattr(e, "saturated", False) and has_room(e, room, self.floor)
            for e in engines
        )

    def _touch(self, key: int, engine: object, now: float, pinned: bool) -> None:
        table = self._table
        table[key] = [engine, now, pinned]
        table.move_to_end(key)
        if len(table) > self.size:
            table.popitem(last=False)

    def _expire(self, now: float) -> None:
        table = self._table
        while table:
            key, (_, used, _) = next(iter(table.items()))
            if now - used < self.ttl:  # type: ignore[operator]
                return
            del table[key]
