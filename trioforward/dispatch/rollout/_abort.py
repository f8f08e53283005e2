"""Abort by request id, rollout group or all: the outstanding requests of one client.

docs/operations.md, "Over-sampling: cancelling a round's stragglers". The
client registers every request from its start to its answer (:meth:`Aborts.enter`
/ :meth:`Aborts.leave`, O(1): a set and two dicts) and remembers the ids and
groups of the last finished ones, so an abort can say what was already done.

``await aborts.abort(group=G)`` (or ``request_ids=[...]``, ``all=True``):

- a request still QUEUED (waiting for capacity, a pause, or between two
  engines) is cancelled there: it never reaches an engine;
- a request on an engine is aborted *on* the engine, by its engine-side id,
  through the engine's abort route on the control pool (:meth:`EngineControl.abort_requests`),
  so the engine answers it with what it decoded so far and ``finish_reason:
  "abort"`` — the same answer an engine pause in mode abort makes it give,
  which the client now hands to the caller instead of replaying. An engine
  without an abort route, or one that has not ended it within ``grace``
  seconds, has its connection closed (a stream is cut where it is, so its
  caller still gets a well-formed end);
- every aborted request is marked ``aborted_by_call``: its caller gets a normal
  answer (the engine's, or one of :mod:`~trioforward.dispatch.dialects._abort_answers`), and neither a replay nor a
  continuation after a weight update ever runs it again.

The call returns once every request it aborted has left the client (answered),
or ``grace`` after it gave up on one, with :class:`AbortCounts`. Unknown ids
and groups count nothing; they are not errors.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import trio

from trioforward.dispatch.attempts._identity import SGLANG_RID_PATHS
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.attempts._types import ForwardResponse
from trioforward.dispatch.dialects._abort_answers import abort_body, generate_items, prompt_count
from trioforward.dispatch.engines._engines import Engine
from trioforward.dispatch.rollout._engine_control import EngineControl, EngineControlError
from trioforward.dispatch.rollout._pause_args import version_label

__all__ = ["Aborts", "AbortCounts", "GroupTail", "ABORT_REASON", "aborted_response"]

log = logging.getLogger("trioforward.dispatch")

ABORT_REASON = "aborted by an abort call"
#: How many finished request ids and groups are remembered (to count ``finished``).
REMEMBERED = 65536


@dataclass(frozen=True, slots=True)
class GroupTail:
    """A rollout group's tail, the figure an RL step waits on (docs/operations.md,
    "Group tails"): ``last`` seconds from its first member's arrival to its last
    member's answer, ``spread`` seconds between its first and its last answer,
    over ``members`` requests. A group ends when its last outstanding member is
    answered (a member sent after that starts the group's next tail)."""

    last: float
    spread: float
    members: int

    def to_json(self) -> dict[str, float | int]:
        return {"last_s": self.last, "spread_s": self.spread, "members": self.members}


@dataclass(frozen=True, slots=True)
class AbortCounts:
    """What one abort did: requests cancelled while ``queued`` (no engine saw
    them), aborted ``on_engine``, and named but ``finished`` already (answered
    before the call; counted for ids and groups among the last
    :data:`REMEMBERED` finished, 0 for ``all``)."""

    queued: int = 0
    on_engine: int = 0
    finished: int = 0
    #: The aborted group's tail, once it ended (an abort by ``group`` only).
    tail: GroupTail | None = None

    def __add__(self, other: AbortCounts) -> AbortCounts:
        return AbortCounts(
            self.queued + other.queued,
            self.on_engine + other.on_engine,
            self.finished + other.finished,
        )

    def to_json(self) -> dict[str, int]:
        """The counts (the group's tail is :attr:`tail`, not in here)."""
        return {"queued": self.queued, "on_engine": self.on_engine, "finished": self.finished}


def engine_names(req: Request) -> list[str]:
    """The names the engine gives the current attempt of ``req``: vLLM prefixes
    the id it took (``cmpl-<id>-<prompt>``, ``chatcmpl-<id>``;
    ``vllm/entrypoints/openai/completion/serving.py``), SGLang and the token
    routes use it as sent. Unknown names are ignored by both abort routes."""
    engine_id = req.engine_request_id
    if engine_id is None:
        return []
    if req.engine is not None and req.engine.kind == "vllm":
        # vLLM's token route names it generate-tokens-<id> (what a rendered
        # token-level request of this attempt used, whatever req.url_path says).
        extra = [f"generate-tokens-{engine_id}"]
    else:
        extra = []
    if req.engine is not None and req.engine.kind == "sglang" and req.url_path in SGLANG_RID_PATHS:
        # Its OpenAI routes ran it as the body's rid; a prompt list's items as
        # <rid>_<i> (its tokenizer aborts exact ids only; n > 1 runs under ids of
        # SGLang's own, which only a closed connection reaches).
        count = prompt_count(req.content) if req.url_path == "/v1/completions" else 1
        return [engine_id, *(f"{engine_id}_{i}" for i in range(count if count > 1 else 0))]
    if req.url_path.endswith("/chat/completions"):
        return [f"chatcmpl-{engine_id}", engine_id, *extra]
    if req.url_path.endswith("/completions"):
        count = prompt_count(req.content)
        return [*(f"cmpl-{engine_id}-{i}" for i in range(count)), engine_id, *extra]
    if req.url_path == "/generate":
        # SGLang's tokenizer aborts an exact id only, and a batch's items have their
        # own: <rid>_<i> for one string rid, the list's ids (<rid>-<i>, docs/server.md,
        # "Token routes") for a list of rids.
        items, listed = generate_items(req.content)
        return [engine_id, *(f"{engine_id}{'-' if listed else '_'}{i}" for i in range(items))]
    return [engine_id, *extra]


class Aborts:
    """The outstanding requests of one client, by id and group (see the module)."""

    def __init__(self, control: EngineControl, grace: float) -> None:
        self.control = control
        self.grace = grace
        self.live: set[Request] = set()
        self.by_id: dict[str, list[Request]] = {}
        self.by_group: dict[str, set[Request]] = {}
        self.finished_ids: OrderedDict[str, None] = OrderedDict()
        self.finished_groups: OrderedDict[str, int] = OrderedDict()
        # Group tails: [first arrival, first answer, last answer, members] of each
        # live group; the tails of the last ended ones; the hook told of each end.
        self._spans: dict[str, list[float]] = {}
        self.tails: OrderedDict[str, GroupTail] = OrderedDict()
        self.on_group_end: Callable[[GroupTail], None] | None = None

    # -- bookkeeping (every request) -------------------------------------------------

    def enter(self, req: Request) -> None:
        self.live.add(req)
        same = self.by_id.get(req.request_id)
        if same is None:
            self.by_id[req.request_id] = [req]
        else:
            same.append(req)
        if req.group is not None:
            members = self.by_group.get(req.group)
            if members is None:
                self.by_group[req.group] = {req}
                if req.group not in self._spans:
                    self._spans[req.group] = [trio.current_time(), -1.0, 0.0, 0]
            else:
                members.add(req)

    def leave(self, req: Request) -> None:
        self.live.discard(req)
        rid = req.request_id
        same = self.by_id.get(rid)
        if same is not None:
            if len(same) == 1:
                del self.by_id[rid]
            else:
                same.remove(req)
        finished = self.finished_ids
        finished[rid] = None
        if len(finished) > REMEMBERED:
            finished.popitem(last=False)
        group = req.group
        if group is not None:
            members = self.by_group.get(group)
            if members is not None:
                members.discard(req)
                self._answered(group, not members)
                if not members:
                    del self.by_group[group]
            if not req.aborted_by_call:
                done = self.finished_groups
                done[group] = done.pop(group, 0) + 1
                if len(done) > REMEMBERED:
                    done.popitem(last=False)
        if req.left is not None:
            req.left.set()

    def _answered(self, group: str, ended: bool) -> None:
        span = self._spans.get(group)
        if span is None:
            return
        now = trio.current_time()
        if span[1] < 0:
            span[1] = now
        span[2] = now
        span[3] += 1
        if ended:
            del self._spans[group]
            tail = GroupTail(now - span[0], now - span[1], int(span[3]))
            self.tails[group] = tail
            if len(self.tails) > REMEMBERED:
                self.tails.popitem(last=False)
            if self.on_group_end is not None:
                self.on_group_end(tail)

    # -- the abort call --------------------------------------------------------------

    def _targets(
        self, request_ids: Iterable[str] | None, group: str | None, every: bool
    ) -> tuple[list[Request], int]:
        if every:
            return list(self.live), 0
        found: dict[int, Request] = {}
        finished = 0
        if group is not None:
            for req in self.by_group.get(group, ()):
                found[id(req)] = req
            finished += self.finished_groups.get(group, 0)
        for rid in request_ids or ():
            same = self.by_id.get(rid)
            if same:
                for req in same:
                    found[id(req)] = req
            elif rid in self.finished_ids:
                finished += 1
        return list(found.values()), finished

    async def abort(
        self,
        *,
        request_ids: Iterable[str] | None = None,
        group: str | None = None,
        every: bool = False,
    ) -> AbortCounts:
        """Abort the matching requests (see the module); returns what it did."""
        targets, finished = self._targets(request_ids, group, every)
        counts = await self.end(targets, finished)
        if group is not None and request_ids is None:
            return replace(counts, tail=self.tails.get(group))
        return counts

    async def end(self, targets: list[Request], finished: int = 0) -> AbortCounts:
        """Abort ``targets`` as :meth:`abort` does (``finished``: the named ones
        already answered, only counted)."""
        queued: list[Request] = []
        dispatched: dict[Engine, list[Request]] = {}
        for req in targets:
            req.aborted_by_call = True
            req.replay = False
            if req.left is None:
                req.left = trio.Event()
            engine = req.engine
            if req.dispatched_at is None or engine is None:
                queued.append(req)
                req.abort(ABORT_REASON)
            else:
                dispatched.setdefault(engine, []).append(req)
        async with trio.open_nursery() as nursery:
            for engine, reqs in dispatched.items():
                nursery.start_soon(self._end_on, engine, reqs)
            nursery.start_soon(self._settle, queued)
        return AbortCounts(len(queued), sum(len(r) for r in dispatched.values()), finished)

    async def _end_on(self, engine: Engine, reqs: list[Request]) -> None:
        """End ``reqs`` on ``engine``: its abort route, then (after ``grace``, or at
        once without one) their connections."""
        asked = False
        try:
            kind = await self.control.kind(engine.url)
            names = [name for req in reqs for name in engine_names(req)]
            await self.control.abort_requests(engine.url, kind, names)
            asked = True
        except EngineControlError as exc:
            log.info("engine %s: abort by id failed (%s); closing the connections", engine.url, exc)
        if asked:
            with trio.move_on_after(self.grace):
                await _all_left(reqs)
        for req in reqs:
            if req.left is not None and not req.left.is_set():
                cut(req)
        await self._settle(reqs)

    async def _settle(self, reqs: list[Request]) -> None:
        """Wait (at most ``grace``) until ``reqs`` have left the client."""
        with trio.move_on_after(self.grace):
            await _all_left(reqs)


def aborted_response(req: Request, weight_version: str | None) -> ForwardResponse:
    """The answer of ``req``, aborted by an abort call before any engine answered
    it: 200, every choice empty with ``finish_reason: "abort"`` (:mod:`~trioforward.dispatch.dialects._abort_answers`)."""
    return ForwardResponse(
        200,
        [(b"content-type", b"application/json")],
        abort_body(req.url_path, req.content, req.request_id),
        req.engine_url or "",
        req.attempts,
        req.queue_time,
        req.engine_time,
        tuple(req.retries) if req.retries else (),
        version_label(req.weight_version, weight_version) if req.attempts else None,
        req.request_id,
    )


def cut(req: Request) -> None:
    """End ``req`` from outside at once: a stream handed to its caller is cut where
    it is (its caller reads the abort tail); anything else is cancelled."""
    body = req.stream_body
    if body is not None and req.handed_over:
        body.cut()
    else:
        req.abort(ABORT_REASON)


async def _all_left(reqs: list[Request]) -> None:
    for req in reqs:
        if req.left is not None:
            await req.left.wait()
