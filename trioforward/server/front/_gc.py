"""Pausing the garbage collector while a burst is in flight (gateway processes only).

Measured (bench/gateway_burst.py, Python 3.11, after ``tune_gc``'s freeze and
thresholds): at 8192 concurrent requests the young-generation collections still
cost ~100 µs per request (1.7 s of collector time per 16 k requests, single passes
up to 190 ms); at 64 concurrent requests ~1 µs. Raising the threshold does not
help (20 000 and 200 000 measured the same total):

- a young collection scans every tracked object allocated since the previous one
  that is still alive; with thousands of requests in flight for seconds, nearly
  all of a request's state (coroutines, cancel scopes, header lists...) is alive
  and gets scanned once whatever the threshold;
- CPython 3.11 decrements the young count when *any* tracked object dies, so
  while a burst drains (old requests freed, new ones allocating) the young list
  grows far past the threshold (260 000 objects in one pass at threshold 20 000).

The request path leaves almost no cyclic garbage (~0.1 object per request), so
the collector buys nothing during a burst. :class:`BurstGC` switches automatic
collection off while at least ``high`` requests are in flight. Under the
gateway's own worker a request counts from the moment its app task is spawned
(``_appchannel.AppTaskGroup``): a burst's requests are all read and their tasks
spawned in one scheduler batch before any of them runs, and counting them only
once they run let ~10 young collections (~15-25 µs per request at 8192) happen
inside that batch (bench/profile_gateway.py). Under another ASGI server the
OpenAI and Tinker front counts its own routes (``_asgi.Front``). When
they drop to ``low`` it freezes what the burst left alive (mostly the per-
connection keep-alive state of thousands of idle connections: scanning it in the
first collection after the burst took up to 360 ms) and re-enables collection.
Frozen objects are still freed by reference counting; only cyclic garbage among
them waits: every ``clean_interval`` seconds the resume instead runs one full
collection over everything (``gc.unfreeze(); gc.collect(); gc.freeze()``), so it
stays bounded. A pause longer than ``max_pause`` (sustained load) runs one young
collection. The collector is only paused when it was enabled, so a process that
disabled it on purpose keeps it off.
"""

from __future__ import annotations

import gc
import time

__all__ = ["BurstGC", "active", "install"]


class BurstGC:
    """Counts in-flight requests (:meth:`enter` / :meth:`exit`, synchronous, O(1)
    except at the pause boundaries) and pauses automatic garbage collection while
    at least ``high`` of them are in flight.

    ``high`` > ``low`` >= 0 (requests); ``max_pause``, ``clean_interval`` in seconds.
    """

    __slots__ = (
        "high",
        "low",
        "max_pause",
        "clean_interval",
        "in_flight",
        "entered",
        "paused_at",
        "cleaned_at",
        "pauses",
        "forced",
        "cleans",
    )

    def __init__(
        self,
        high: int = 512,
        low: int = 128,
        max_pause: float = 30.0,
        clean_interval: float = 600.0,
    ) -> None:
        if not high > low >= 0:
            raise ValueError(f"need high > low >= 0, got high={high} low={low}")
        self.high = high
        self.low = low
        self.max_pause = max_pause
        self.clean_interval = clean_interval
        self.in_flight = 0
        self.entered = 0  # enter() calls (a pause's length is checked every 1024)
        self.paused_at: float | None = None  # time.monotonic() of the pause start
        self.cleaned_at = time.monotonic()  # last full collection by resume()
        self.pauses = 0  # pauses started
        self.forced = 0  # young collections because a pause outlasted max_pause
        self.cleans = 0  # full collections by resume()

    def enter(self) -> None:
        self.in_flight += 1
        self.entered += 1
        if self.in_flight >= self.high:
            if self.paused_at is None:
                if gc.isenabled():
                    gc.disable()
                    self.paused_at = time.monotonic()
                    self.pauses += 1
            elif self.entered & 1023 == 0 and time.monotonic() - self.paused_at > self.max_pause:
                gc.collect(0)
                self.forced += 1
                self.paused_at = time.monotonic()

    def exit(self) -> None:
        self.in_flight -= 1
        if self.paused_at is not None and self.in_flight <= self.low:
            self.resume()

    def resume(self) -> None:
        """Ends a pause this object started (no-op otherwise): freezes the survivors
        (or, once per ``clean_interval``, collects everything) and re-enables collection."""
        if self.paused_at is None:
            return
        self.paused_at = None
        now = time.monotonic()
        if now - self.cleaned_at >= self.clean_interval:
            self.cleaned_at = now
            self.cleans += 1
            gc.unfreeze()
            gc.collect()
        gc.freeze()
        gc.enable()


active: BurstGC | None = None


def install(guard: BurstGC | None) -> None:
    """Makes ``guard`` the process's burst guard (``None``: none, and the data-plane
    routes never touch the collector). Ends the previous guard's pause, if any.
    Called by ``tune_gc``."""
    global active
    if active is not None:
        active.resume()
    active = guard
