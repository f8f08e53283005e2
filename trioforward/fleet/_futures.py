"""Tinker futures shared by the fleet: dedupe, results and completion notices in Redis.

The member that accepts an ``asample`` runs the sample and keeps the result in
its own in-memory future store (the gateway's ``FutureStore``); this module
adds what makes the future the fleet's (docs/fleet.md, "Tinker futures"):

- **Dedupe.** ``(sampling_session_id, seq_id) -> request id`` is claimed with
  ``SET NX GET`` (Redis >= 7.0): the first member to claim a key runs the
  sample, every resubmit anywhere gets the same id. Claims made together go
  out in one Lua script call (``EVALSHA``), not one command each.
- **Results.** A finished result's bytes are written once, with the retention
  TTL, and a small *finished* marker with a longer TTL; ids finished in one
  burst go out in one script call, which also publishes their ids (``PUBLISH``).
- **Polls elsewhere.** A member asked for an id it does not hold reads the
  result from Redis; a pending one is waited for on the completion channel
  (one subscription per member) up to the poll hold.
- **410 vs 404.** An id answers 410 once its result expired (the finished
  marker is there but the bytes are not) or when its owner is no longer a live
  member (it left or crashed: the SDK resubmits, nothing is lost). Ids that
  were never issued keep answering 404 (the local store recognises them).

Batching into a script rather than a pipeline is for the gateway's CPU: the
client builds and checks each pipelined command in Python (tens of µs a
sample), a script call is built once per batch (docs/performance.md, fleet
notes). All keys carry the fleet's hash tag, so on a Redis Cluster a script's
keys share one slot.

Request ids are ``tf-<epoch>-<n>``; ``<epoch>`` names the member that issued it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio
from coredis import PureToken
from coredis.exceptions import AuthorizationError, UnknownCommandError

from trioforward.fleet._redis import STATE_ERRORS

if TYPE_CHECKING:
    from trioforward.fleet._member import Fleet

__all__ = ["SharedFutures", "StateUnavailable", "FutureExpired"]

log = logging.getLogger("trioforward.fleet")

# How much longer than the result the "it finished" marker lives.
FINISHED_MARKER_FACTOR = 8
# Results written per script call at most (bounds one round trip's size).
MAX_BATCH = 256

# What a server that does not let this client run scripts answers (an ACL without
# @scripting: NOPERM; a service that disabled EVAL: unknown command). The member
# then sends the same commands as a pipeline (docs/fleet.md, "Tinker futures").
SCRIPTS_REFUSED = (AuthorizationError, UnknownCommandError)

# KEYS: the dedupe keys; ARGV: the candidate id of each, then the TTL (ms).
# Returns the id each key held before (false/nil where this call claimed it).
CLAIM_SCRIPT = """
local ttl = ARGV[#KEYS + 1]
local previous = {}
for i, key in ipairs(KEYS) do
  previous[i] = redis.call('SET', key, ARGV[i], 'NX', 'GET', 'PX', ttl)
end
return previous
"""

# KEYS: result key, finished key of each id in turn; ARGV: each result's bytes,
# then the result TTL (ms), the marker TTL (ms), the channel and the notice.
WRITE_SCRIPT = """
local count = #KEYS / 2
for i = 1, count do
  redis.call('SET', KEYS[2 * i - 1], ARGV[i], 'PX', ARGV[count + 1])
  redis.call('SET', KEYS[2 * i], '1', 'PX', ARGV[count + 2])
end
redis.call('PUBLISH', ARGV[count + 3], ARGV[count + 4])
return count
"""


class StateUnavailable(Exception):
    """The shared state did not answer (HTTP 503 with ``Retry-After``)."""


class FutureExpired(LookupError):
    """The id was issued, but its result expired or its owner left (HTTP 410)."""


class _Claim:
    """One pending dedupe claim: the key, the candidate id, and its answer."""

    __slots__ = ("key", "request_id", "done", "result", "failed")

    def __init__(self, key: str, request_id: str) -> None:
        self.key = key
        self.request_id = request_id
        self.done = trio.Event()
        self.result: str | None = None
        self.failed: str | None = None


class SharedFutures:
    """This member's side of the fleet's futures. Built by the :class:`Fleet`."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._keys = fleet.keys
        settings = fleet.settings
        self._retention_ms = max(1, round(settings.future_retention * 1000))
        self._dedupe_ms = self._retention_ms * FINISHED_MARKER_FACTOR
        self._timeout = settings.member_ttl
        self._send, self._receive = trio.open_memory_channel[tuple[str, bytes]](float("inf"))
        self._waiters: dict[str, trio.Event] = {}
        self._claims: list[_Claim] = []
        self._claims_ready = trio.Event()
        # Loaded on first use and again after a restart or failover (NOSCRIPT).
        self._claim_script = fleet.redis.register_script(CLAIM_SCRIPT)
        self._write_script = fleet.redis.register_script(WRITE_SCRIPT)
        self.scripts = True  # False once the server refused a script: pipelines from then on

    # -- submitting ---------------------------------------------------------------

    async def claim(self, session: str, seq_id: Any, request_id: str) -> str | None:
        """Claim ``(session, seq_id)`` for ``request_id``. Returns ``None`` if this
        call claimed it (run the sample), else the id claimed first (anywhere).
        Claims made while a batch is in flight go out together in the next
        pipeline (:meth:`run_claims`). Raises :class:`StateUnavailable` when Redis
        does not answer within ``member_ttl`` (the claim may still have been
        made: the caller runs its own claims it finds unheld on a resubmit)."""
        if self._fleet.degraded:
            raise StateUnavailable("shared state unreachable")
        slot = _Claim(self._keys.dedupe(session, str(seq_id)), request_id)
        self._claims.append(slot)
        self._claims_ready.set()
        with trio.move_on_after(self._timeout):
            await slot.done.wait()
        if not slot.done.is_set():
            raise StateUnavailable("shared state did not answer in time")
        if slot.failed is not None:
            raise StateUnavailable(slot.failed)
        return slot.result

    async def run_claims(self) -> None:
        """Send the queued claims, one script call of ``SET NX GET`` per batch, until
        cancelled. Every claim of a batch gets its answer or its failure."""
        while True:
            await self._claims_ready.wait()
            self._claims_ready = trio.Event()
            batch, self._claims = self._claims, []
            if not batch:
                continue
            try:
                with trio.move_on_after(self._timeout) as scope:
                    replies = await self._send_claims(batch)
                    for slot, previous in zip(batch, replies, strict=True):
                        # nil arrives as None (RESP2) or False (RESP3 from a Lua false).
                        slot.result = bytes(previous).decode() if previous else None
                if scope.cancelled_caught:
                    for slot in batch:
                        slot.failed = "shared state did not answer in time"
            except STATE_ERRORS as exc:
                for slot in batch:
                    slot.failed = f"shared state unreachable ({type(exc).__name__})"
            finally:
                for slot in batch:
                    slot.done.set()

    async def _send_claims(self, batch: list[_Claim]) -> list[Any]:
        """One script call for ``batch`` (or one pipeline where scripts are refused):
        the id each key held before, ``None``/``False`` where this call claimed it."""
        if self.scripts:
            args: list[Any] = [slot.request_id for slot in batch]
            args.append(self._dedupe_ms)
            try:
                return list(await self._claim_script(keys=[slot.key for slot in batch], args=args))
            except SCRIPTS_REFUSED as exc:
                self._refused(exc)
        async with self._fleet.redis.pipeline(transaction=False) as pipe:
            replies = [
                pipe.set(slot.key, slot.request_id, condition=PureToken.NX, get=True, px=self._dedupe_ms)
                for slot in batch
            ]
        return [await reply for reply in replies]

    def _refused(self, exc: BaseException) -> None:
        self.scripts = False
        log.warning(
            "the shared state refused a script (%s): Tinker futures go out as pipelines"
            " from now on (more gateway CPU per sample; docs/fleet.md, \"Tinker futures\")",
            type(exc).__name__,
        )

    # -- finishing ----------------------------------------------------------------

    def finished(self, request_id: str, content_type: str, body: bytes) -> None:
        """Queue a finished result for Redis (never blocks; written by :meth:`run`)."""
        self._send.send_nowait((request_id, content_type.encode() + b"\n" + body))

    async def run(self) -> None:
        """Write queued results, one script call per batch, until cancelled. A batch
        that fails (Redis away) is retried until it succeeds: a result is never
        dropped while this member lives (other members' polls wait or 408)."""
        while True:
            batch = [await self._receive.receive()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            while not await self._write(batch):
                await self._fleet.wait_tick()  # retry once the next heartbeat ran

    async def _write(self, batch: list[tuple[str, bytes]]) -> bool:
        keys = self._keys
        names: list[str] = []
        args: list[Any] = []
        for request_id, blob in batch:
            names += (keys.result(request_id), keys.finished(request_id))
            args.append(blob)
        notice = " ".join(request_id for request_id, _ in batch)
        args += (self._retention_ms, self._dedupe_ms, keys.done, notice)
        with trio.move_on_after(self._timeout):
            try:
                if self.scripts:
                    try:
                        await self._write_script(keys=names, args=args)
                        return True
                    except SCRIPTS_REFUSED as exc:
                        self._refused(exc)
                async with self._fleet.redis.pipeline(transaction=False) as pipe:
                    for request_id, blob in batch:
                        pipe.set(keys.result(request_id), blob, px=self._retention_ms)
                        pipe.set(keys.finished(request_id), b"1", px=self._dedupe_ms)
                    pipe.publish(keys.done, notice)
                return True
            except STATE_ERRORS:
                return False
        return False

    # -- polls for other members' futures -----------------------------------------

    def notice(self, data: bytes) -> None:
        """A completion notice (ids separated by spaces): wake their local pollers."""
        for raw in data.split():
            event = self._waiters.pop(raw.decode(), None)
            if event is not None:
                event.set()

    def recheck_all(self) -> None:
        """Wake every held poll to read its result again: the completion channel was
        just (re)subscribed, and a notice published while it was down is lost."""
        waiters, self._waiters = self._waiters, {}
        for event in waiters.values():
            event.set()

    async def fetch(self, request_id: str, hold: float) -> tuple[str, bytes] | None:
        """The result of a future another member issued: ``(content_type, body)``,
        or ``None`` if it is still pending after ``hold`` seconds (HTTP 408).
        Raises :class:`FutureExpired` (410) or :class:`StateUnavailable` (503)."""
        deadline = trio.current_time() + hold
        while True:
            event = self._waiters.setdefault(request_id, trio.Event())
            found = await self._read(request_id)
            if found is not None or trio.current_time() >= deadline:
                return found
            # Held until a completion notice (or a re-subscription) says to read
            # again, or its owner leaves the fleet (then the read answers 410 at
            # once, not after the hold).
            with trio.move_on_at(deadline):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._until_owner_left, _epoch(request_id), nursery.cancel_scope)
                    await event.wait()
                    nursery.cancel_scope.cancel()

    async def _until_owner_left(self, epoch: str, scope: trio.CancelScope) -> None:
        while self._fleet.epoch_alive(epoch):
            await self._fleet.wait_tick()
        scope.cancel()

    async def _read(self, request_id: str) -> tuple[str, bytes] | None:
        keys = self._keys
        with trio.move_on_after(self._timeout):
            try:
                blob, marker = await self._fleet.redis.mget(
                    [keys.result(request_id), keys.finished(request_id)]
                )
            except STATE_ERRORS as exc:
                raise StateUnavailable(f"shared state unreachable ({type(exc).__name__})") from None
            if blob is not None:
                self._waiters.pop(request_id, None)
                content_type, _, body = bytes(blob).partition(b"\n")
                return content_type.decode(), body
            if marker is not None:
                raise FutureExpired(f"future {request_id!r} expired")
            if not self._fleet.epoch_alive(_epoch(request_id)):
                self._waiters.pop(request_id, None)
                raise FutureExpired(f"the member that issued {request_id!r} left the fleet")
            return None
        raise StateUnavailable("shared state did not answer in time")


def _epoch(request_id: str) -> str:
    """The issuing member's epoch of ``tf-<epoch>-<n>`` ("" for other shapes)."""
    return request_id.split("-")[1] if request_id.count("-") == 2 else ""
