"""Agent sessions over a dispatch client: the gateway's and the embedded API
(docs/sessions.md).

::

    async with trioforward.open_client(engines=[...]) as client:
        sessions = Sessions(client)
        answer = await sessions.chat("episode-1", messages, model="m", max_tokens=64)
        ...
        sessions.reward("episode-1", 1.0)
        for seq in sessions.arrays("episode-1"):      # numpy, one per linear run
            train(seq["token_ids"], seq["loss_mask"], seq["logprobs"])
        sessions.end("episode-1")
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import orjson
import trio

from trioforward.sessions._history import Rendered, turn_prompt
from trioforward.sessions._render import EngineRenderer, Renderer
from trioforward.sessions._shared import SharedState, claimed, load, save, state_key
from trioforward.sessions._store import Session, SessionError, SessionStore, Turn
from trioforward.sessions._stream import StreamedTurn
from trioforward.sessions._tools import TOOL_PARSERS
from trioforward.sessions._trajectory import sequence_arrays, trajectory_json
from trioforward.sessions._turn import (
    answer_message,
    chat_answer,
    check_body,
    completion_body,
    record_turn,
)

if TYPE_CHECKING:
    from trioforward.dispatch import Client, ForwardResponse

__all__ = ["Sessions"]


class Sessions:
    """The sessions of one gateway process or embedded client.

    ``renderer``: how messages become tokens (default :class:`EngineRenderer`:
    the engine's ``/tokenize``); ``max_sessions``, ``ttl`` (s): the store's bounds
    (docs/sessions.md, "Lifetime and memory"); ``shared``: a fleet's state
    store, which then holds every session instead of this process (docs/sessions.md,
    "Fleet mode"; the async methods read it, the others this process's store);
    ``tool_parser``: how tool calls in an answer are parsed (docs/sessions.md,
    "Tool calls": ``"hermes"``, ``"qwen3_json"`` or ``"none"``; raises
    ``ValueError`` for another).
    ``tenant`` arguments take a
    tenant name, a ``Tenant`` or ``None`` (the client's default tenant); a
    session belongs to the tenant that started it and no other sees it.
    """

    def __init__(
        self,
        client: Client,
        *,
        renderer: Renderer | None = None,
        max_sessions: int = 100_000,
        ttl: float = 3600.0,
        shared: SharedState | None = None,
        tool_parser: str = "hermes",
    ) -> None:
        if tool_parser not in TOOL_PARSERS:
            raise ValueError(
                f"tool_parser must be one of {', '.join(TOOL_PARSERS)} (got {tool_parser!r})"
            )
        self.tool_parser = tool_parser
        self.client = client
        self.renderer: Renderer = renderer or EngineRenderer(client)
        self.store = SessionStore(max_sessions, ttl)
        self.shared = shared

    def _tenant(self, tenant: Any) -> str:
        if tenant is None:
            return str(self.client.tenants.default.name)
        return tenant if isinstance(tenant, str) else str(tenant.name)

    @asynccontextmanager
    async def _held(self, tenant: str, session_id: str) -> AsyncIterator[Session]:
        """The session, held for one turn: claimed in the fleet's store (written back
        when the turn added to it) or marked busy in this process's (a first turn
        that added nothing leaves no session). Raises :class:`SessionError` 409
        (a turn of it runs), 429 (store full), 503 (fleet store unreachable)."""
        if self.shared is not None:
            async with claimed(
                self.shared, tenant, session_id, create=True, now=time.time()
            ) as held:
                count = len(held.turns)
                yield held
                if len(held.turns) != count:
                    held.last_used = time.time()
                    with trio.CancelScope(shield=True):  # the turn is done: keep it
                        await save(self.shared, held, self.store.ttl)
            return
        session = self.store.open(tenant, session_id)
        if session.busy:
            raise SessionError(
                409,
                f"session {session_id!r} has a turn running; send the next turn after its answer",
                "session_busy",
            )
        session.busy = True
        try:
            yield session
        finally:
            session.busy = False
            session.last_used = time.time()
            if not session.turns:  # a first turn that failed leaves nothing behind
                self.store.discard(tenant, session_id)

    async def _prompt(self, session: Session, body: dict[str, Any], tenant: Any) -> Rendered:
        """The turn's prompt (docs/sessions.md, "How a turn is built")."""
        messages, tools = check_body(body)
        model = body.get("model")

        async def render(msgs: list[dict[str, Any]], generation: bool) -> list[int]:
            return await self.renderer.chat_ids(
                msgs, tools, generation, model=model, tenant=tenant, session=session.id
            )

        return await turn_prompt(session, messages, tools, render)

    def _commit(
        self,
        session: Session,
        body: dict[str, Any],
        turn: Turn,
        text: str,
        parsed: tuple[dict[str, Any], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Add ``turn`` (the engine sampled ``text``) to the session; returns the
        chat answer's message (``parsed``: already made, as :func:`answer_message`
        gives it)."""
        message, kept = parsed or answer_message(text, body, self.tool_parser)
        session.turns.append(turn)
        session.messages = [*body["messages"], kept]
        session.tools = body.get("tools")
        return message

    async def turn(
        self, session_id: str, body: dict[str, Any], *, tenant: Any = None, **forward: Any
    ) -> tuple[ForwardResponse, bytes | None]:
        """Serve one chat turn ``body`` (a ``/v1/chat/completions`` body, not
        streamed) of the session: returns the engine's response and the chat
        answer bytes (``None`` when the engine refused: its status and body go
        back as they are, and the session is unchanged). ``forward``: more
        keyword arguments of ``Client.request`` (``request_id``, ``group``,
        ``on_dispatch``, ``span``). Raises :class:`SessionError` (400 bad body
        or unrenderable history, 409 a turn of the session is running, 429 store
        full, 502 no token ids, 503 fleet store unreachable) and the dispatch
        core's errors."""
        check_body(body)
        if body.get("stream"):
            raise SessionError(
                400,
                'a streamed session turn goes through Sessions.streamed (docs/sessions.md, "Streamed turns")',
                "unsupported_in_session",
            )
        async with self._held(self._tenant(tenant), session_id) as session:
            rendered = await self._prompt(session, body, tenant)
            started = time.time()
            response = await self.client.request(
                "POST", "/v1/completions",
                json=completion_body(body, rendered.ids, self.tool_parser),
                session=session_id, tenant=tenant, **forward,
            )  # fmt: skip
            if response.status != 200:
                return response, None
            try:
                answer = orjson.loads(response.content)
            except orjson.JSONDecodeError:
                answer = {}
            turn, choice = record_turn(
                answer, rendered, started, response.engine, response.weight_version
            )
            message = self._commit(session, body, turn, choice.get("text") or "")
            turn.queue_time, turn.engine_time = response.queue_time, response.engine_time
            where = {"id": session_id, "turn": len(session.turns) - 1, "branch": turn.branch}
            content = chat_answer(body, answer, choice, message, turn, where, response.request_id)
            return response, content

    @asynccontextmanager
    async def streamed(
        self, session_id: str, body: dict[str, Any], *, tenant: Any = None, request_id: str = ""
    ) -> AsyncIterator[StreamedTurn]:
        """One streamed chat turn (``body`` with ``stream``) of the session: yields a
        :class:`~trioforward.sessions.StreamedTurn` whose ``completion`` body the
        caller streams from the engine (``POST /v1/completions``), passing each run
        of whole SSE events through its ``events`` and setting its ``engine``,
        ``queue_time`` and ``version`` once dispatched; on exit the turn is
        recorded when the engine's stream completed (docs/sessions.md, "Streamed
        turns"), else the session is unchanged. Raises :class:`SessionError` as
        :meth:`turn` (before anything is streamed; a 502/503 at the end: the
        stream went out, the turn is not recorded)."""
        check_body(body)
        async with self._held(self._tenant(tenant), session_id) as session:
            rendered = await self._prompt(session, body, tenant)
            where = {
                "id": session_id, "turn": len(session.turns),
                "branch": rendered.branch_reason is not None,
            }  # fmt: skip
            streamed = StreamedTurn(body, rendered.ids, self.tool_parser, where, request_id)
            streamed.completion = completion_body(body, rendered.ids, self.tool_parser)
            streamed.started = time.time()
            yield streamed
            if streamed.done:
                turn, _ = record_turn(
                    streamed.answer(), rendered, streamed.started, streamed.engine, streamed.version
                )
                self._commit(session, body, turn, streamed.text, streamed.parsed)
                turn.queue_time = streamed.queue_time
                turn.engine_time = max(turn.finished - streamed.started - streamed.queue_time, 0.0)

    async def chat(
        self, session: str, messages: list[dict[str, Any]], *, tenant: Any = None, **fields: Any
    ) -> dict[str, Any]:
        """The embedded form of a session turn: ``fields`` are the chat body's
        (``model``, ``max_tokens``, ``tools``, ...); returns the chat answer as a
        dict. Raises :class:`SessionError` as :meth:`turn`, and for an engine
        refusal (its status, ``engine_refused``, its body as the message)."""
        response, content = await self.turn(
            session, {**fields, "messages": messages}, tenant=tenant
        )
        if content is None:
            raise SessionError(
                response.status, response.content.decode(errors="replace"), "engine_refused"
            )
        result: dict[str, Any] = orjson.loads(content)
        return result

    def get(self, session_id: str, tenant: Any = None) -> Session:
        """The session; raises :class:`SessionError` 404."""
        return self.store.get(self._tenant(tenant), session_id)

    def trajectory(self, session_id: str, tenant: Any = None) -> dict[str, Any]:
        """The session as JSON-ready data (docs/sessions.md, "Trajectories")."""
        return trajectory_json(self.get(session_id, tenant))

    def arrays(self, session_id: str, tenant: Any = None) -> list[dict[str, Any]]:
        """The session's sequences as numpy arrays (``token_ids`` int32,
        ``loss_mask`` int8, ``logprobs`` float32, shape ``(L,)``), one per linear run."""
        return sequence_arrays(self.get(session_id, tenant))

    def reward(
        self,
        session_id: str,
        reward: float,
        *,
        turn: int | None = None,
        name: str = "reward",
        tenant: Any = None,
    ) -> Session:
        """Attach ``reward`` to the session (under ``name``) or to one ``turn``;
        raises :class:`SessionError` 404 (unknown session) or 400 (no such turn)."""
        session = self.get(session_id, tenant)
        _apply_reward(session, reward, turn, name)
        return session

    def end(self, session_id: str, tenant: Any = None) -> dict[str, Any]:
        """End the session; returns its trajectory. Raises :class:`SessionError` 404;
        409 while a turn runs."""
        session = self.get(session_id, tenant)
        if session.busy:
            raise SessionError(409, f"session {session_id!r} has a turn running", "session_busy")
        self.store.end(session.tenant, session_id)
        return trajectory_json(session)

    def export_jsonl(self, tenant: Any = None) -> bytes:
        """The tenant's sessions, one trajectory a line (JSONL), least recently used first."""
        return b"".join(
            orjson.dumps(trajectory_json(s)) + b"\n"
            for s in self.store.of_tenant(self._tenant(tenant))
        )

    # -- the gateway's routes: the fleet's store when shared, else this process's --

    async def fetch(self, session_id: str, tenant: Any = None) -> dict[str, Any]:
        """The trajectory (as :meth:`trajectory`), from the shared store when there is one."""
        if self.shared is None:
            return self.trajectory(session_id, tenant)
        return trajectory_json(await load(self.shared, self._tenant(tenant), session_id))

    async def add_reward(
        self,
        session_id: str,
        reward: float,
        *,
        turn: int | None = None,
        name: str = "reward",
        tenant: Any = None,
    ) -> Session:
        """As :meth:`reward`; in the shared store, claimed (409 while a turn runs)."""
        if self.shared is None:
            return self.reward(session_id, reward, turn=turn, name=name, tenant=tenant)
        async with claimed(
            self.shared, self._tenant(tenant), session_id, create=False, now=time.time()
        ) as held:
            _apply_reward(held, reward, turn, name)
            await save(self.shared, held, self.store.ttl)
            return held

    async def close(self, session_id: str, tenant: Any = None) -> dict[str, Any]:
        """As :meth:`end`; in the shared store, claimed (409 while a turn runs)."""
        if self.shared is None:
            return self.end(session_id, tenant)
        name = self._tenant(tenant)
        async with claimed(self.shared, name, session_id, create=False, now=time.time()) as held:
            try:
                await self.shared.remove(state_key(name, session_id))
            except ConnectionError:
                raise SessionError(
                    503, "the fleet's state store is unreachable; retry", "state_unavailable"
                ) from None
            return trajectory_json(held)

    async def export(self, tenant: Any = None) -> bytes:
        """As :meth:`export_jsonl`; from the shared store, in key order."""
        if self.shared is None:
            return self.export_jsonl(tenant)
        name = self._tenant(tenant)
        head = state_key(name, "")
        try:
            keys = await self.shared.keys(head)
        except ConnectionError:
            raise SessionError(
                503, "the fleet's state store is unreachable; retry", "state_unavailable"
            ) from None
        lines = []
        for key in keys:
            try:
                lines.append(
                    orjson.dumps(trajectory_json(await load(self.shared, name, key[len(head) :])))
                    + b"\n"
                )
            except SessionError as err:
                if err.status != 404:  # ended or expired since the scan: skipped
                    raise
        return b"".join(lines)


def _apply_reward(session: Session, reward: float, turn: int | None, name: str) -> None:
    if turn is None:
        session.rewards[name] = float(reward)
    elif type(turn) is int and -len(session.turns) <= turn < len(session.turns):
        session.turns[turn].reward = float(reward)
    else:
        raise SessionError(
            400,
            f"session {session.id!r} has no turn {turn!r} ({len(session.turns)} turns)",
            "invalid_turn",
        )
