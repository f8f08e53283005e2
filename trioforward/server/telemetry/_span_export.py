"""The gateway's span export: a bounded queue and one export thread (docs/operations.md, "End-to-end traces").

A slow or dead collector must never slow or fail a request. Ending a span only
appends it to a bounded deque (no lock, no I/O, no log line); a daemon thread
takes batches off it and hands them to the OTLP exporter, which blocks on
HTTP for up to its own timeout. A span that finds the queue full is dropped,
and a batch the exporter could not deliver is dropped too; both are counted
(``on_drop(count, reason)``: the gateway's ``trioforward_trace_spans_dropped``
metric).

Why not the SDK's ``BatchSpanProcessor``: it counts drops only through the
SDK's opt-in internal metrics (``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``
and an OpenTelemetry meter provider), and logs a warning for each span it
drops — a log line per request on the request path while a collector is down.
Its batching knobs are read the same way here: ``OTEL_BSP_MAX_QUEUE_SIZE``
(2048), ``OTEL_BSP_SCHEDULE_DELAY`` (5000 ms), ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``
(512), as the OpenTelemetry SDK specification defines them
(https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/#batch-span-processor).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["BoundedExport", "batch_knobs"]

OnDrop = Callable[[int, str], None]
SHUTDOWN_WAIT = 2.0  # s: the last export at shutdown, then again after the exporter's shutdown


def batch_knobs(env: Mapping[str, str] = os.environ) -> tuple[int, float, int]:
    """``(max_queue_size, schedule_delay_s, max_export_batch_size)`` from the
    ``OTEL_BSP_*`` variables (SDK defaults when unset or not a positive number)."""

    def read(name: str, default: int) -> int:
        try:
            value = int(env.get(name, default))
        except ValueError:
            return default
        return value if value > 0 else default

    queue = read("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
    delay = read("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
    batch = min(read("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512), queue)
    return queue, delay, batch


class BoundedExport(SpanProcessor):
    """Exports sampled spans in batches from a queue of at most ``max_queue`` spans.

    ``exported``: spans the exporter accepted; ``dropped_full`` /
    ``dropped_failed``: spans dropped because the queue was full / their export
    failed (each counter is written by one thread only).
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue: int,
        delay: float,
        batch: int,
        on_drop: OnDrop = lambda count, reason: None,
    ) -> None:
        self._exporter = exporter
        self._max_queue = max_queue
        self._delay = delay
        self._batch = batch
        self._on_drop = on_drop
        self._queue: deque[ReadableSpan] = deque()  # append and popleft are thread-safe
        self._wake = threading.Event()
        self._stopping = False
        self.exported = 0
        self.dropped_full = 0
        self.dropped_failed = 0
        self._thread = threading.Thread(target=self._run, name="trioforward-span-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None or not context.trace_flags.sampled:
            return
        queue = self._queue
        if len(queue) >= self._max_queue:
            self.dropped_full += 1
            self._on_drop(1, "queue_full")
            return
        queue.append(span)
        if len(queue) >= self._batch:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._drain(once=False)
        self._drain(once=True)  # at shutdown, what is left: one batch, best effort

    def _drain(self, *, once: bool) -> None:
        """Export what is queued, a batch at a time (one batch if ``once``)."""
        queue = self._queue
        while queue:
            batch: list[ReadableSpan] = []
            while queue and len(batch) < self._batch:
                batch.append(queue.popleft())
            try:
                result = self._exporter.export(batch)
            except Exception:  # an exporter bug must not end the thread
                result = SpanExportResult.FAILURE
            if result is SpanExportResult.SUCCESS:
                self.exported += len(batch)
            else:
                self.dropped_failed += len(batch)
                self._on_drop(len(batch), "export_failed")
            if once or self._stopping:
                return

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wake the export thread (it exports what is queued); never waits."""
        self._wake.set()
        return True

    def shutdown(self) -> None:
        """Stop the thread after one more batch (given :data:`SHUTDOWN_WAIT`), then
        shut the exporter down, which ends an export still retrying against a dead
        collector. Blocks for at most twice :data:`SHUTDOWN_WAIT`: call it from a
        thread, not the event loop."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=SHUTDOWN_WAIT)
        self._exporter.shutdown()
        self._thread.join(timeout=SHUTDOWN_WAIT)
