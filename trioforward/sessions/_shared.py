"""Sessions kept in a state store shared by a fleet (docs/sessions.md, "Fleet
mode"): each turn claims its session in the store, loads it, runs, writes it
back, and drops the claim, so any member serves any turn and a member that
dies loses nothing (the store keeps every completed turn; its claim expires)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import trio

from trioforward.sessions._codec import decode, encode
from trioforward.sessions._store import Session, SessionError

__all__ = ["SharedState", "claimed", "load", "save", "state_key", "CLAIM_TTL"]

# A claim outlives the longest turn it guards; a member killed mid-turn leaves the
# session claimed (409 session_busy) for at most this long, its history intact.
CLAIM_TTL = 600.0


class SharedState(Protocol):
    """The store's side (the fleet's: ``trioforward.fleet`` provides one). Every
    method raises ``ConnectionError`` when the store is unreachable."""

    async def load(self, key: str) -> bytes | None: ...
    async def store(self, key: str, data: bytes, ttl: float) -> None: ...
    async def remove(self, key: str) -> None: ...
    async def claim(self, key: str, ttl: float) -> bool: ...
    async def release(self, key: str) -> None: ...
    async def keys(self, prefix: str) -> list[str]: ...


def state_key(tenant: str, session_id: str) -> str:
    """The store key of a session: tenant-scoped (the tenant's length first, so
    no tenant name can make another's key)."""
    return f"{len(tenant)}:{tenant}:{session_id}"


def _unavailable(exc: BaseException) -> SessionError:
    return SessionError(
        503, f"the fleet's state store is unreachable ({exc}); retry", "state_unavailable"
    )


def _missing(session_id: str) -> SessionError:
    return SessionError(
        404, f"no session {session_id!r} (ended, expired, or never started)", "session_not_found"
    )


async def load(shared: SharedState, tenant: str, session_id: str) -> Session:
    """The session as the store holds it; :class:`SessionError` 404 / 503."""
    try:
        data = await shared.load(state_key(tenant, session_id))
    except ConnectionError as exc:
        raise _unavailable(exc) from None
    if data is None:
        raise _missing(session_id)
    return decode(data)


async def save(shared: SharedState, session: Session, ttl: float) -> None:
    """Write the session back (its TTL restarts); :class:`SessionError` 503."""
    try:
        await shared.store(state_key(session.tenant, session.id), encode(session), ttl)
    except ConnectionError as exc:
        raise _unavailable(exc) from None


@asynccontextmanager
async def claimed(
    shared: SharedState, tenant: str, session_id: str, *, create: bool, now: float
) -> AsyncIterator[Session]:
    """The session, claimed for one writer while the block runs. ``create``: a
    session the store does not hold starts empty (else 404). Raises
    :class:`SessionError` 409 (claimed elsewhere), 404, 503."""
    key = state_key(tenant, session_id)
    try:
        got = await shared.claim(key, CLAIM_TTL)
    except ConnectionError as exc:
        raise _unavailable(exc) from None
    if not got:
        raise SessionError(
            409,
            f"session {session_id!r} has a turn running; send the next turn after its answer",
            "session_busy",
        )
    try:
        try:
            data = await shared.load(key)
        except ConnectionError as exc:
            raise _unavailable(exc) from None
        if data is None and not create:
            raise _missing(session_id)
        yield decode(data) if data is not None else Session(session_id, tenant, now, now)
    finally:
        with trio.CancelScope(shield=True):  # cleanup that awaits is shielded
            try:
                await shared.release(key)
            except ConnectionError:
                pass  # the claim expires on its own (CLAIM_TTL)
