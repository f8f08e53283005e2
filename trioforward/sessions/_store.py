"""The session store: each agent session's token history, tenant-scoped, bounded
in memory, with an idle TTL (docs/sessions.md, "Lifetime and memory").

A session is a list of :class:`Turn` records. Token ids are ``np.int32`` and
logprobs ``np.float32`` arrays (4 bytes a token each), so a session's memory is
its tokens, not Python ints. Sessions are kept in one ``OrderedDict`` in order
of last use: a use moves the session to the end, so the idle ones are at the
front and expiry pops from there — O(expired), never a scan of every session.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Turn", "Session", "SessionStore", "SessionError"]


class SessionError(Exception):
    """A session call that cannot be served: ``status`` (404 unknown, 409 busy,
    429 store full, 400/422 bad input), ``code`` and a message for the caller."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def to_json(self) -> dict[str, Any]:
        """The OpenAI-style error body."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "code": self.code}}


@dataclass(slots=True)
class Turn:
    """One chat turn as the engine saw it.

    ``prompt_ids``: ``int32 (p,)``, the whole prompt the engine got;
    ``token_ids``: ``int32 (n,)``, what it sampled (stop token included);
    ``logprobs``: ``float32 (n,)``; ``new_start``: where in ``prompt_ids`` the
    tokens this turn added begin (what came before is the previous turn's prompt
    and sampled tokens; 0 on a first turn or a branch); ``branch``: the turn was
    rendered whole, with ``branch_reason``; ``weight_versions``: spans
    ``[{"version", "start", "end"}]`` over ``token_ids``; ``started``/``finished``:
    Unix times (s); ``engine``: the engine's URL; ``finish_reason``; ``reward``;
    ``queue_time``/``engine_time``: seconds the generation waited for engine
    capacity / ran on engines (the dispatch core's, as ``Server-Timing`` reports).
    """

    prompt_ids: npt.NDArray[np.int32]
    token_ids: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float32]
    new_start: int
    branch: bool
    branch_reason: str | None
    weight_versions: list[dict[str, Any]]
    started: float
    finished: float
    engine: str
    finish_reason: str | None
    reward: float | None = None
    queue_time: float = 0.0
    engine_time: float = 0.0


@dataclass(slots=True)
class Session:
    """One session: ``turns`` in order; ``messages``: the last turn's messages plus
    the assistant message it answered with (what the next turn must start with to
    extend it); ``rewards``: trajectory-level rewards by name; ``busy``: a turn is
    running (a second concurrent turn is refused 409: one history, one writer)."""

    id: str
    tenant: str
    created: float
    last_used: float
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: Any = None
    rewards: dict[str, float] = field(default_factory=dict)
    busy: bool = False


class SessionStore:
    """The sessions of one gateway process (or embedded client).

    ``max_sessions``: sessions held at most; a new one beyond is refused (429
    ``session_store_full``) rather than evicting a live episode's history;
    ``ttl``: seconds a session may stay unused before it is dropped; ``clock``:
    seconds (Unix time by default). Not safe across threads; in trio every
    method is atomic (none awaits).
    """

    def __init__(
        self,
        max_sessions: int = 100_000,
        ttl: float = 3600.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.max_sessions = max_sessions
        self.ttl = ttl
        self._clock = clock or time.time
        self._sessions: OrderedDict[tuple[str, str], Session] = OrderedDict()
        self.expired_total = 0
        self.ended_total = 0

    def __len__(self) -> int:
        self.expire()
        return len(self._sessions)

    def expire(self) -> int:
        """Drop every session idle longer than ``ttl`` (none busy); returns how many."""
        cutoff = self._clock() - self.ttl
        dropped = 0
        sessions = self._sessions
        while sessions:
            key, oldest = next(iter(sessions.items()))
            if oldest.last_used > cutoff or oldest.busy:
                break
            del sessions[key]
            dropped += 1
        self.expired_total += dropped
        return dropped

    def get(self, tenant: str, session_id: str) -> Session:
        """The session, touched; raises :class:`SessionError` 404 when ``tenant``
        has none of that id (another tenant's session is not found either)."""
        self.expire()
        session = self._sessions.get((tenant, session_id))
        if session is None:
            raise SessionError(
                404,
                f"no session {session_id!r} (ended, expired, or never started)",
                "session_not_found",
            )
        return session

    def open(self, tenant: str, session_id: str) -> Session:
        """The session of that id, created on its first turn; touched (moved to the
        end of the idle order). Raises :class:`SessionError` 429 when full."""
        self.expire()
        key = (tenant, session_id)
        now = self._clock()
        session = self._sessions.get(key)
        if session is None:
            if self.max_sessions and len(self._sessions) >= self.max_sessions:
                raise SessionError(
                    429,
                    f"the gateway holds {self.max_sessions} sessions (max_sessions); end some first",
                    "session_store_full",
                )
            session = self._sessions[key] = Session(session_id, tenant, now, now)
        else:
            self._sessions.move_to_end(key)
            session.last_used = now
        return session

    def discard(self, tenant: str, session_id: str) -> None:
        """Forget the session if it is held (no error when it is not)."""
        self._sessions.pop((tenant, session_id), None)

    def end(self, tenant: str, session_id: str) -> Session:
        """Remove and return the session; raises :class:`SessionError` 404 (unknown)."""
        session = self.get(tenant, session_id)
        del self._sessions[(tenant, session_id)]
        self.ended_total += 1
        return session

    def of_tenant(self, tenant: str) -> Iterator[Session]:
        """The tenant's sessions, least recently used first."""
        self.expire()
        return (s for (t, _), s in list(self._sessions.items()) if t == tenant)
