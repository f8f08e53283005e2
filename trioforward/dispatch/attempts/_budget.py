"""The global retry budget (docs/design.md, "Retry rules"): retries are at most a fraction of requests.

A token bucket whose deposits expire, as Finagle's ``RetryBudget``: every request
deposits ``ratio`` tokens, and ``floor`` tokens per second are always available;
a retry withdraws one token. Deposits older than ``window`` seconds no longer
count, so a long healthy period cannot bank an unbounded storm for the day an
engine goes down hard.

Pure bookkeeping: the caller passes the clock. O(1) per call (amortised): the
window is a ring of one-second slots whose sums are kept incrementally.
"""

from __future__ import annotations

import math

__all__ = ["RetryBudget"]


class RetryBudget:
    """Windowed token bucket. ``ratio``: retries per request; ``floor``: retries per second."""

    __slots__ = (
        "ratio",
        "floor",
        "_slots",
        "_requests",
        "_retries",
        "_sum_requests",
        "_sum_retries",
        "_epoch",
    )

    def __init__(self, ratio: float, floor: float, window: int = 10) -> None:
        if window < 1:
            raise ValueError("window must be >= 1 second")
        self.ratio = ratio
        self.floor = floor
        self._slots = window
        self._requests = [0] * window
        self._retries = [0] * window
        self._sum_requests = 0
        self._sum_retries = 0
        self._epoch = -1  # the whole second of the newest slot

    def _advance(self, now: float) -> int:
        second = math.floor(now)
        epoch = self._epoch
        if second != epoch:
            if epoch < 0 or second - epoch >= self._slots or second < epoch:
                self._requests = [0] * self._slots
                self._retries = [0] * self._slots
                self._sum_requests = self._sum_retries = 0
            else:
                for s in range(epoch + 1, second + 1):
                    i = s % self._slots
                    self._sum_requests -= self._requests[i]
                    self._sum_retries -= self._retries[i]
                    self._requests[i] = 0
                    self._retries[i] = 0
            self._epoch = second
        return second % self._slots

    def deposit(self, now: float) -> None:
        """Record one request (``ratio`` tokens)."""
        i = self._advance(now)
        self._requests[i] += 1
        self._sum_requests += 1

    def available(self, now: float) -> float:
        """Tokens left in the window (may be fractional; a retry needs >= 1)."""
        self._advance(now)
        return self.ratio * self._sum_requests + self.floor * self._slots - self._sum_retries

    def try_withdraw(self, now: float) -> bool:
        """Take one retry token; ``False`` (and nothing taken) if the budget is spent."""
        i = self._advance(now)
        if self.ratio * self._sum_requests + self.floor * self._slots - self._sum_retries < 1.0:
            return False
        self._retries[i] += 1
        self._sum_retries += 1
        return True
