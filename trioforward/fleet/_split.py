"""The capacity split: how ``engine_capacity`` is divided among a fleet's members.

Pure and deterministic (no I/O, no clock, no randomness): every member computes
it from the same snapshot of demands and gets the same answer, so the shares
the members apply sum to the engine's capacity without any member telling
another what to do (docs/fleet.md, "Capacity leases").
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["fair_split"]


def fair_split(capacity: int, demands: Mapping[str, int]) -> dict[str, int]:
    """Split ``capacity`` requests over members with the given ``demands``
    (member id -> requests queued + running on this member for the engine).

    Max-min fair with a floor of one: each member gets 1 first (an engine
    queue cannot hold 0 tokens, and an idle member can then start
    a request without waiting for a re-split); the rest is water-filled over the
    demands above that floor, and whatever no member demands is spread evenly,
    so the shares always sum to ``capacity``. Integer remainders go to members
    in sorted id order. With more members than ``capacity`` every member still
    gets 1 (the sum is then ``len(demands)``: docs/fleet.md states that case).

    Returns member id -> share (>= 1); ``{}`` when ``demands`` is empty.
    Raises ``ValueError`` for ``capacity < 1`` (unlimited engines are not split).
    """
    if capacity < 1:
        raise ValueError(f"cannot split an unlimited engine (capacity {capacity})")
    members = sorted(demands)
    if not members:
        return {}
    shares = dict.fromkeys(members, 1)
    left = capacity - len(members)
    if left <= 0:
        return shares
    wants = {m: max(0, demands[m] - 1) for m in members}
    left = _water_fill(shares, wants, left)
    if left > 0:
        # Nobody asks for it: spread it so a burst anywhere can start at once.
        _water_fill(shares, dict.fromkeys(members, left), left)
    return shares


def _water_fill(shares: dict[str, int], wants: Mapping[str, int], left: int) -> int:
    """Add to ``shares`` (in place) up to ``wants`` each, smallest wants first filled,
    at most ``left`` in all. Returns what is left over."""
    given = dict.fromkeys(shares, 0)
    active = [m for m in shares if wants[m] > 0]  # sorted: ``shares`` is built sorted
    while active and left > 0:
        per = left // len(active)
        if per == 0:
            for member in active[:left]:
                given[member] += 1
            left = 0
            break
        still = []
        for member in active:
            take = min(per, wants[member] - given[member])
            given[member] += take
            left -= take
            if given[member] < wants[member]:
                still.append(member)
        active = still
    for member, extra in given.items():
        shares[member] += extra
    return left
