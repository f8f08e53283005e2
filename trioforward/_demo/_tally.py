"""What the demo counts: every request's outcome, by API, and the gateway's histograms.

A request is a success only when the client got what the API promises (a 200
with a non-empty ``choices`` list, a stream that ended with ``[DONE]``, a Tinker
sample with tokens). Anything else is a failure with its reason kept, so the
summary can never count a failure as a success.

The tally is written from the trio thread and from the SDK worker threads; one
``threading.Lock`` guards it (the critical sections are a few dict updates).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Tally", "Window", "quantile", "histogram_quantile", "parse_histograms"]

MAX_EXAMPLES = 8


@dataclass(slots=True)
class Window:
    """A time span of the run (monotonic seconds) during which something was going on."""

    name: str
    start: float = math.inf
    end: float = math.inf
    notes: dict[str, object] = field(default_factory=dict)


class Tally:
    """Thread-safe counters of request outcomes.

    ``ok[api]`` and ``failed[api]`` count requests; ``latency[api]`` keeps the
    client-side latencies in seconds; ``examples`` keeps the first few failure
    messages verbatim.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.t0 = time.monotonic()
        self.ok: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.latency: defaultdict[str, list[float]] = defaultdict(list)
        self.examples: list[str] = []
        self.spans: list[tuple[str, float, float, bool]] = []  # (api, start, end, ok)
        self.windows: dict[str, Window] = {}
        self.events: Counter[str] = Counter()  # named events (``note``)

    def now(self) -> float:
        """Seconds since the tally was created."""
        return time.monotonic() - self.t0

    def note(self, event: str, count: int = 1) -> None:
        """Count ``count`` of a named event (e.g. a stream resubmitted after a pause ended it)."""
        with self._lock:
            self.events[event] += count

    def record(self, api: str, start: float, ok: bool, error: str | None = None, *, count: int = 1) -> None:
        """Record ``count`` requests of ``api`` that started at ``start`` (``now()`` clock)."""
        end = self.now()
        with self._lock:
            if ok:
                self.ok[api] += count
            else:
                self.failed[api] += count
                if len(self.examples) < MAX_EXAMPLES:
                    self.examples.append(f"{api}: {error}")
            self.latency[api].append(end - start)
            self.spans.append((api, start, end, ok))

    def window(self, name: str) -> Window:
        with self._lock:
            return self.windows.setdefault(name, Window(name))

    @property
    def total_ok(self) -> int:
        return sum(self.ok.values())

    @property
    def total_failed(self) -> int:
        return sum(self.failed.values())

    def apis(self) -> list[str]:
        return sorted(set(self.ok) | set(self.failed))

    def spans_overlapping(self, start: float, end: float) -> list[tuple[str, float, float, bool]]:
        """Requests that started inside ``[start, end]``."""
        with self._lock:
            return [s for s in self.spans if start <= s[1] <= end]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def histogram_quantile(buckets: Iterable[tuple[float, float]], q: float) -> float:
    """Prometheus ``histogram_quantile``: ``buckets`` are cumulative ``(le, count)`` pairs.

    Interpolates linearly inside the bucket holding the rank, like PromQL does.
    Returns NaN for an empty histogram; the largest finite bound when the rank
    falls in the ``+Inf`` bucket.
    """
    pairs = sorted(buckets)
    if not pairs or pairs[-1][1] <= 0:
        return math.nan
    total = pairs[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in pairs:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def parse_histograms(text: str) -> dict[str, list[tuple[float, float]]]:
    """Histograms in Prometheus text: ``{family: [(le, cumulative count), ...]}``.

    Series of one family with different labels (other than ``le``) are summed,
    so each family is its histogram over all engines and statuses.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        sums: dict[float, float] = defaultdict(float)
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                sums[float(sample.labels["le"])] += sample.value
        out[family.name] = sorted(sums.items())
    return out
