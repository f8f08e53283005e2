"""Agent sessions in the fleet's state store (docs/sessions.md, "Fleet mode").

One key per session, ``<prefix>session:<key>``, holding its bytes with the
session TTL (rewritten, so the TTL restarts, after every turn), and a claim key
``<prefix>claim:<key>`` set with ``SET NX PX`` while a member runs a turn of it
(one writer per session across the fleet; the claim expires on its own when
the member dies mid-turn). Any member serves any turn: nothing of a session
lives in a member. Redis errors surface as ``ConnectionError`` (the sessions
layer answers 503).
"""

from __future__ import annotations

from typing import Any

from coredis import PureToken

from trioforward.fleet._redis import STATE_ERRORS, Keys

__all__ = ["FleetSessions"]


class FleetSessions:
    """The state-store side of :class:`trioforward.sessions.Sessions` (its
    ``shared`` store) on the fleet's Redis client ``redis``."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis = redis
        self.prefix = keys.prefix

    async def load(self, key: str) -> bytes | None:
        """A session's bytes, ``None`` when it has none (never, ended or expired)."""
        try:
            data = await self.redis.get(self.prefix + "session:" + key)
        except STATE_ERRORS as exc:
            raise ConnectionError(f"state store: {exc}") from exc
        return None if data is None else bytes(data)

    async def store(self, key: str, data: bytes, ttl: float) -> None:
        """Write a session's bytes, expiring after ``ttl`` seconds unused."""
        try:
            await self.redis.set(self.prefix + "session:" + key, data, px=max(1, int(ttl * 1000)))
        except STATE_ERRORS as exc:
            raise ConnectionError(f"state store: {exc}") from exc

    async def remove(self, key: str) -> None:
        """Forget a session."""
        try:
            await self.redis.delete([self.prefix + "session:" + key])
        except STATE_ERRORS as exc:
            raise ConnectionError(f"state store: {exc}") from exc

    async def claim(self, key: str, ttl: float) -> bool:
        """Claim the session for one turn (``False``: another turn holds it)."""
        try:
            done = await self.redis.set(
                self.prefix + "claim:" + key,
                b"1",
                condition=PureToken.NX,
                px=max(1, int(ttl * 1000)),
            )
        except STATE_ERRORS as exc:
            raise ConnectionError(f"state store: {exc}") from exc
        return bool(done)

    async def release(self, key: str) -> None:
        """Drop the claim (a failure leaves it to expire)."""
        try:
            await self.redis.delete([self.prefix + "claim:" + key])
        except STATE_ERRORS as exc:
            raise ConnectionError(f"state store: {exc}") from exc

    async def keys(self, prefix: str) -> list[str]:
        """The keys of the sessions whose key starts with ``prefix`` (a scan: for exports)."""
        head = self.prefix + "session:"
        try:
            found = [k async for k in self.redis.scan_iter(match=_glob(head + prefix) + "*")]
        except STATE_ERRORS as exc:
            raise ConnectionError(f"state store: {exc}") from exc
        return sorted((k.decode() if isinstance(k, bytes) else str(k))[len(head) :] for k in found)


def _glob(text: str) -> str:
    # SCAN MATCH is a glob: its special characters in a key are escaped.
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
