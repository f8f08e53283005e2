"""Pool bookkeeping: per-origin idle deques, connection slots and FIFO waiters.

Bookkeeping is by counters and per-origin deques, never by scanning (docs/design.md, "The connection pool"):

- ``origin.idle`` is a deque of parked connections, oldest on the left. Release
  appends on the right; checkout pops on the right (newest first: the one least
  likely to have been closed by the engine's keep-alive timer); expiry pops on
  the left. Every connection is pushed and popped once per request, so acquire
  and release are O(1) (amortized for expiry).
- A *slot* is a token held by the task driving a connection, from the moment
  it decides to reuse or connect until it parks or closes the connection.
  ``origin.held`` counts them; with ``max_connections`` reached, a task parks
  in ``origin.lot`` (FIFO). A release with waiters hands its slot directly to
  the first waiter (``held`` unchanged) instead of waking everybody.
- Invariant: ``held + len(idle) <= max_connections``. A slot holder only opens
  a connection when the idle deque is empty, and a release moves a connection
  from held to idle.

No locks: in trio the code between two checkpoints is atomic, and every
mutation of the bookkeeping here happens between checkpoints.
"""

from __future__ import annotations

from collections import deque

import trio

from trioforward._h11 import h11
from trioforward.http._connection import Connection
from trioforward.http._models import PoolStatistics, Target, parse_target
from trioforward.http._phases import Attempt

__all__ = ["OriginSlots"]

_inf = float("inf")
_current_time = trio.current_time
_MAX_TARGETS = 4096  # parsed-URL cache entries before the cache is dropped
_DONE = h11.DONE


class _Origin:
    """Per ``http://host:port`` state. ``spec`` is the ``(scheme, host, port)`` errors carry."""

    __slots__ = ("key", "host", "port", "spec", "idle", "lot", "held")

    def __init__(self, target: Target) -> None:
        self.key = target.key
        self.host = target.host
        self.port = target.port
        self.spec = ("http", target.host, target.port)
        self.idle: deque[Connection] = deque()
        self.lot = trio.lowlevel.ParkingLot()
        self.held = 0


class OriginSlots:
    """Slots, idle deques and counters behind one :class:`~trioforward.http.ConnectionPool`.

    The package-internal interface the exchanges (``ConnectionPool.request``,
    :class:`~trioforward.http.StreamContext`) use, one call per step of a
    connection's use:

    - :meth:`lookup` — the parsed target and its origin's state for a URL;
    - :meth:`checkout` — take a slot and a connection (may wait, may connect);
    - :meth:`checkin` — the response was read to its end: park or close;
    - :meth:`discard` — the exchange failed or was abandoned: close.

    Every ``checkout`` is paired with exactly one ``checkin`` or ``discard``.
    Everything here is synchronous except ``checkout``.
    """

    def __init__(
        self,
        *,
        max_connections: int = 0,
        idle_expiry: float = 4.0,
        connect_timeout: float | None = 60.0,
    ) -> None:
        if max_connections < 0:
            raise ValueError("max_connections must be >= 0 (0 = unlimited)")
        self._limit = max_connections
        self._idle_expiry = idle_expiry
        self._connect_timeout = connect_timeout
        self._origins: dict[str, _Origin] = {}
        self._targets: dict[str, tuple[Target, _Origin]] = {}
        self._idle = 0
        self._active = 0
        self._connecting = 0
        self._waiting = 0
        self._opened_total = 0
        self._reused_total = 0
        self._closed_total = 0
        self._closed = False  # set by close(): nothing parks any more

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot of the counters, summed over origins (O(1))."""
        return PoolStatistics(
            idle=self._idle,
            active=self._active,
            connecting=self._connecting,
            waiting=self._waiting,
            opened_total=self._opened_total,
            reused_total=self._reused_total,
            closed_total=self._closed_total,
        )

    def close_idle(self, origin: str | None = None) -> None:
        """Close the idle connections of every origin, or of one ``"http://host:port"``.

        Connections in use are not touched (they close or park when their
        request ends). An unknown origin is a no-op.
        """
        if origin is None:
            origins = list(self._origins.values())
        else:
            known = self._origins.get(parse_target(origin).key)
            origins = [known] if known is not None else []
        for o in origins:
            while o.idle:
                self._discard_idle(o.idle.pop())

    def close(self) -> None:
        """Close every idle connection; connections checked in later are closed too."""
        self._closed = True
        self.close_idle()

    def lookup(self, url: str) -> tuple[Target, _Origin]:
        """The parsed ``url`` and its origin's state (cached; raises ``ValueError``)."""
        hit = self._targets.get(url)
        if hit is None:
            target = parse_target(url)
            origin = self._origins.get(target.key)
            if origin is None:
                origin = self._origins[target.key] = _Origin(target)
            if len(self._targets) >= _MAX_TARGETS:
                self._targets.clear()
            hit = self._targets[url] = (target, origin)
        return hit

    async def checkout(self, origin: _Origin, deadline: float) -> Connection:
        """Take a slot, then the newest live idle connection or a new one.

        On any exception (timeout, connect failure, cancellation) the slot is
        given back and no socket stays open.
        """
        if self._limit and origin.held >= self._limit:
            await self._wait_for_slot(origin, deadline)  # the slot is handed to us
        else:
            origin.held += 1
        idle = origin.idle
        if idle:
            now = _current_time()
            while idle:
                conn = idle.pop()
                self._idle -= 1
                if now - conn.idle_since >= self._idle_expiry:
                    # The newest is too old, so all of them are.
                    self._close(conn)
                    while idle:
                        self._discard_idle(idle.popleft())
                    break
                if conn.is_readable():  # closed by the engine, or junk: never reuse
                    self._close(conn)
                    continue
                self._active += 1
                self._reused_total += 1
                return conn
        self._connecting += 1
        try:
            conn = await self._connect(origin, deadline)
        except BaseException:
            self._connecting -= 1
            self._release_slot(origin)
            raise
        self._connecting -= 1
        self._active += 1
        self._opened_total += 1
        return conn

    async def _wait_for_slot(self, origin: _Origin, deadline: float) -> None:
        self._waiting += 1
        try:
            if deadline == _inf:
                await origin.lot.park()
                return
            with trio.CancelScope(deadline=deadline) as scope:
                await origin.lot.park()
            # If park() returned, the slot is ours even when the deadline passed too.
            if scope.cancelled_caught:
                raise Attempt(origin.spec).timeout("deadline (waiting for a connection slot)")
        finally:
            self._waiting -= 1

    async def _connect(self, origin: _Origin, deadline: float) -> Connection:
        """``trio.open_tcp_stream`` in the caller's own scope.

        trio closes every socket it opened if the connect fails or is
        cancelled, so nothing is left to clean up here.
        """
        limit, what = deadline, "deadline"
        if self._connect_timeout is not None:
            bound = _current_time() + self._connect_timeout
            if bound < limit:
                limit, what = bound, "connect_timeout"
        try:
            if limit == _inf:
                stream = await trio.open_tcp_stream(origin.host, origin.port)
                return Connection(stream)
            with trio.CancelScope(deadline=limit) as scope:
                stream = await trio.open_tcp_stream(origin.host, origin.port)
                return Connection(stream)
            assert scope.cancelled_caught
            raise Attempt(origin.spec).timeout(what)
        except OSError as exc:
            raise Attempt(origin.spec).failure(exc) from exc

    def checkin(self, origin: _Origin, conn: Connection) -> None:
        """The response was read to the end: park the connection if h11 allows."""
        h = conn.h11
        # Bytes after the response (junk, or a response nobody asked for) would be
        # read as the next answer: only an empty buffer is reusable.
        if h.our_state is _DONE and h.their_state is _DONE and not h.trailing_data[0]:
            h.start_next_cycle()
            conn.requests += 1
            self._park(origin, conn)
        else:
            self.discard(origin, conn)

    def discard(self, origin: _Origin, conn: Connection) -> None:
        """The exchange failed or was left unfinished: close, then pass the slot on."""
        self._active -= 1
        self._close(conn)
        self._release_slot(origin)

    def _park(self, origin: _Origin, conn: Connection) -> None:
        self._active -= 1
        if not self._closed:
            now = conn.idle_since = _current_time()
            idle = origin.idle
            idle.append(conn)
            self._idle += 1
            # Expire from the left: only the oldest can be stale, stop at the first fresh one.
            horizon = now - self._idle_expiry
            while idle and idle[0].idle_since <= horizon:
                self._discard_idle(idle.popleft())
        else:
            self._close(conn)
        self._release_slot(origin)

    def _release_slot(self, origin: _Origin) -> None:
        if origin.lot:
            origin.lot.unpark()  # direct hand-off: ``held`` stays, the first waiter owns it
        else:
            origin.held -= 1

    def _discard_idle(self, conn: Connection) -> None:
        self._idle -= 1
        self._close(conn)

    def _close(self, conn: Connection) -> None:
        conn.close()
        self._closed_total += 1
