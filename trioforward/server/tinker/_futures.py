"""The Tinker future store: request ids -> results, with the SDK's retry rules made safe.

What the SDK does (``tinker/lib/api_future_impl.py``, ``retry_handler.py``,
``public_interfaces/sampling_client.py``, SDK 0.38) and what the store answers:

- ``asample`` is retried on 408/409/5xx and connection errors with the *same*
  ``(sampling_session_id, seq_id)``: :meth:`FutureStore.submit` returns the future
  already issued for that key, so a resubmit never reaches an engine twice.
- A poll that times out or gets 408/5xx is re-polled for the same id, so a
  result written to a dead socket must still be there: results are kept until
  delivered on a live connection (:meth:`FutureStore.mark_delivered`), then for
  ``retention`` seconds, for late re-polls that must get the same bytes.
- 410 on a poll makes the SDK resubmit with a new ``seq_id``; 404 is fatal to
  the user's ``sample()``. So an id this store issued but no longer holds is
  :class:`FutureGone` (410) and only an id never issued is :class:`FutureUnknown`
  (404). Issued ids are recognised without remembering them: an id is
  ``"tf-<epoch>-<n>"`` with ``n`` below the issue counter. An id of another epoch
  (an earlier gateway process) is gone, not unknown: the SDK then resubmits.
- A sample the gateway's drain ended before any engine ran it
  (:meth:`FutureStore.abandon`) is dropped: its id answers 410, held polls
  included, so the SDK resubmits it (docs/tinker.md, "Futures").
- Memory is bounded: at most ``max_retained`` finished results are kept (oldest
  delivered evicted first, then oldest undelivered) and at most
  ``max_outstanding`` samples are unfinished (:class:`StoreFull`, 429, beyond).

Every operation is O(1) (amortised): dicts and ordered dicts, no scans. The
store does no I/O; only :meth:`FutureStore.wait` awaits (a ``trio.Event``
created lazily, and only for a future somebody is polling).
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import trio

__all__ = [
    "Future",
    "FutureStore",
    "FutureStatistics",
    "FutureUnknown",
    "FutureGone",
    "StoreFull",
    "StoreClosing",
    "PENDING",
    "READY",
    "DELIVERED",
    "EVICTED",
]

# Future.state values (ints: one compare on the hot path).
PENDING = 0  # the sample is running (or queued for an engine)
READY = 1  # finished, not yet delivered on a live connection
DELIVERED = 2  # delivered at least once; kept until its retention deadline
EVICTED = 3  # dropped from the store; its id now answers 410


class FutureUnknown(LookupError):
    """The id was never issued by this store (HTTP 404)."""


class FutureGone(LookupError):
    """The id was issued but its result is no longer held (HTTP 410: the SDK resubmits)."""


class StoreFull(Exception):
    """``max_outstanding`` samples are unfinished (HTTP 429: the SDK backs off)."""


class StoreClosing(Exception):
    """The drain reached its cutoff with the sample still running: a poll will not
    be held for it here (HTTP 503 ``shutting_down``: the SDK polls again)."""


class Future:
    """One issued request id. ``body`` and ``content_type`` are set once, when it finishes."""

    __slots__ = (
        "request_id",
        "key",
        "num_samples",
        "state",
        "body",
        "content_type",
        "event",
        "deadline",
        "weight_version",
    )

    def __init__(self, request_id: str, key: Hashable | None, num_samples: int) -> None:
        self.request_id = request_id
        self.key = key
        self.num_samples = num_samples
        self.state = PENDING
        self.body: bytes = b""
        self.content_type = ""
        self.event: trio.Event | None = None
        self.deadline = 0.0
        # The weights that produced the result (``X-Weight-Version``, docs/operations.md).
        self.weight_version: str | None = None

    @property
    def sample_sequence_ids(self) -> list[str]:
        """One id per requested sample, aligned with the response's sequences."""
        return [f"{self.request_id}.{i}" for i in range(self.num_samples)]


@dataclass(frozen=True, slots=True)
class FutureStatistics:
    """Counts, for tests and the benchmark."""

    outstanding: int  # unfinished samples
    ready: int  # finished, undelivered
    delivered: int  # delivered, in their retention window
    issued_total: int
    deduplicated_total: int
    evicted_total: int
    rejected_total: int


class FutureStore:
    """Issued futures and their encoded results.

    ``hold``: longest a poll waits (s). ``retention``: how long a delivered result
    stays (s). ``max_retained``: finished results kept at most (0 = unlimited).
    ``max_outstanding``: unfinished samples allowed (0 = unlimited). ``clock``:
    seconds, monotonic (``trio.current_time`` by default).
    """

    def __init__(
        self,
        *,
        hold: float = 30.0,
        retention: float = 300.0,
        max_retained: int = 262144,
        max_outstanding: int = 262144,
        clock: Callable[[], float] = trio.current_time,
        epoch: str | None = None,
    ) -> None:
        self.hold = hold
        self.retention = retention
        self.max_retained = max_retained
        self.max_outstanding = max_outstanding
        self._clock = clock
        self._prefix = f"tf-{epoch or secrets.token_hex(4)}-"
        self._next = 0
        self._futures: dict[str, Future] = {}
        self._by_key: dict[Hashable, Future] = {}
        self._outstanding = 0
        # Finished futures in finishing order / in delivery order (= deadline order,
        # the clock being monotonic): eviction pops from the left in O(1).
        self._ready: OrderedDict[str, Future] = OrderedDict()
        self._delivered: OrderedDict[str, Future] = OrderedDict()
        self._deduplicated = 0
        self._evicted = 0
        self._rejected = 0
        # Called with (request_id, content_type, body) as each result finishes:
        # fleet mode copies it to the shared state (docs/fleet.md).
        self.on_resolve: Callable[[str, str, bytes], None] | None = None
        self.closing = False  # see close()

    @property
    def outstanding(self) -> int:
        """Unfinished samples."""
        return self._outstanding

    # -- issuing -------------------------------------------------------------
    def reserve_id(self) -> str:
        """A fresh request id of this store, for :meth:`submit` (fleet mode claims it
        in the shared state first)."""
        request_id = f"{self._prefix}{self._next}"
        self._next += 1
        return request_id

    def submit(
        self, key: Hashable | None, num_samples: int, request_id: str | None = None
    ) -> tuple[Future, bool]:
        """The future for ``key`` (a resubmit), or a new one: ``(future, created)``.

        ``key`` is ``(sampling_session_id, seq_id)``; ``None`` never deduplicates.
        ``request_id``: one from :meth:`reserve_id` (default: a fresh one).
        Raises :class:`StoreFull` when a new future would pass ``max_outstanding``.
        """
        self.expire()
        if key is not None:
            existing = self._by_key.get(key)
            if existing is not None:
                self._deduplicated += 1
                return existing, False
        if self.max_outstanding and self._outstanding >= self.max_outstanding:
            self._rejected += 1
            raise StoreFull(f"{self._outstanding} samples outstanding (max_outstanding)")
        if request_id is None:
            request_id = self.reserve_id()
        future = Future(request_id, key, num_samples)
        self._futures[request_id] = future
        if key is not None:
            self._by_key[key] = future
        self._outstanding += 1
        return future, True

    def lookup_key(self, key: Hashable | None) -> Future | None:
        """The future already issued for ``key`` (a resubmit), or ``None``."""
        if key is None:
            return None
        self.expire()
        future = self._by_key.get(key)
        if future is not None:
            self._deduplicated += 1
        return future

    def resolve(
        self, future: Future, body: bytes, content_type: str, weight_version: str | None = None
    ) -> None:
        """Store the finished result (encoded once) and wake its pollers.

        ``weight_version``: the version of the weights that produced it (``None``:
        none recorded), answered as ``X-Weight-Version`` by ``retrieve_future``."""
        if future.state != PENDING:
            return
        future.body = body
        future.content_type = content_type
        future.weight_version = weight_version
        future.state = READY
        self._outstanding -= 1
        self._ready[future.request_id] = future
        if self.on_resolve is not None:
            self.on_resolve(future.request_id, content_type, body)
        if future.event is not None:
            future.event.set()
            future.event = None
        self._enforce_limit()

    def abandon(self, future: Future) -> None:
        """Drop a pending ``future`` that will never run (the drain ended it while
        QUEUED): its id answers 410 from now on and its held polls wake to that."""
        if future.state != PENDING:
            return
        self._outstanding -= 1
        self._evict(future)
        if future.event is not None:
            future.event.set()
            future.event = None

    def close(self) -> None:
        """The drain's cutoff: polls are no longer held for pending futures (those
        held wake, and :meth:`wait` raises :class:`StoreClosing` for them, as for
        any later poll while they are pending); finished results are still served.
        O(held futures), once."""
        self.closing = True
        for future in list(self._futures.values()):
            if future.state == PENDING and future.event is not None:
                future.event.set()
                future.event = None

    # -- retrieval -----------------------------------------------------------
    def get(self, request_id: str) -> Future:
        """The held future. Raises :class:`FutureGone` or :class:`FutureUnknown`."""
        self.expire()
        future = self._futures.get(request_id)
        if future is not None:
            return future
        raise FutureGone(request_id) if self.was_issued(request_id) else FutureUnknown(request_id)

    async def wait(self, request_id: str, hold: float | None = None) -> Future | None:
        """The finished future, waiting up to ``hold`` (default :attr:`hold`) seconds.

        Returns ``None`` if it is still pending then. Cancelling the wait (the
        client went away) changes nothing for the sample, which keeps running.
        Raises :class:`FutureGone` (also when it is abandoned meanwhile),
        :class:`FutureUnknown`, or :class:`StoreClosing` for a pending future once
        the store is closed (:meth:`close`).
        """
        future = self.get(request_id)
        if future.state == PENDING:
            if self.closing:
                raise StoreClosing(request_id)
            if future.event is None:
                future.event = trio.Event()
            with trio.move_on_after(self.hold if hold is None else hold):
                await future.event.wait()
            if future.state == PENDING:
                if self.closing:
                    raise StoreClosing(request_id)
                return None
            if future.state == EVICTED:
                raise FutureGone(request_id)
        return future

    def mark_delivered(self, future: Future) -> None:
        """The result was written on a live connection: start its retention window."""
        if future.state != READY:
            return  # already delivered (its window runs from the first delivery), or evicted
        del self._ready[future.request_id]
        future.state = DELIVERED
        future.deadline = self._clock() + self.retention
        self._delivered[future.request_id] = future

    def holds(self, request_id: str) -> bool:
        """Whether ``request_id`` is held here now (pending or finished)."""
        return request_id in self._futures

    def is_own(self, request_id: str) -> bool:
        """Whether ``request_id`` was issued by this store (this process)."""
        return request_id.startswith(self._prefix)

    def was_issued(self, request_id: str) -> bool:
        """Whether this id has the shape of one this store (or an earlier process) issued."""
        if request_id.startswith(self._prefix):
            n = request_id[len(self._prefix) :]
            return n.isdigit() and int(n) < self._next
        parts = request_id.split("-")
        return len(parts) == 3 and parts[0] == "tf" and len(parts[1]) == 8 and parts[2].isdigit()

    # -- bounds --------------------------------------------------------------
    def expire(self) -> None:
        """Evict delivered results whose retention window is over."""
        if not self._delivered:
            return
        now = self._clock()
        while self._delivered:
            request_id, future = next(iter(self._delivered.items()))
            if future.deadline > now:
                break
            self._delivered.popitem(last=False)
            self._evict(future)

    def _enforce_limit(self) -> None:
        if not self.max_retained:
            return
        while len(self._ready) + len(self._delivered) > self.max_retained:
            queue = self._delivered if self._delivered else self._ready
            _, future = queue.popitem(last=False)
            self._evict(future)

    def _evict(self, future: Future) -> None:
        future.state = EVICTED
        future.body = b""
        del self._futures[future.request_id]
        if future.key is not None and self._by_key.get(future.key) is future:
            del self._by_key[future.key]
        self._evicted += 1

    def statistics(self) -> FutureStatistics:
        return FutureStatistics(
            outstanding=self._outstanding,
            ready=len(self._ready),
            delivered=len(self._delivered),
            issued_total=self._next,
            deduplicated_total=self._deduplicated,
            evicted_total=self._evicted,
            rejected_total=self._rejected,
        )
