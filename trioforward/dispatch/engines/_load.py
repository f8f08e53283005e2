"""Engines' own load reports, read on the control pool (docs/dispatch.md, "Capacity from the engine").

- vLLM (kind ``vllm``): ``GET /metrics``, Prometheus text. Read: the gauges
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (a fraction 0..1 despite its name) and the
  counter ``vllm:num_preemptions_total``, each summed over its ``engine``
  labels (data-parallel ranks) — the names vLLM 0.32 writes
  (``vllm/v1/metrics/loggers.py``; a recorded sample is
  ``bench/results/vllm_metrics_sample.txt``).
- SGLang (kind ``sglang``): ``GET /get_load``, a JSON list with one object per
  data-parallel rank: ``num_reqs`` (running + waiting), ``num_waiting_reqs``,
  ``num_tokens`` (the KV pool, tokens) and ``num_pending_tokens`` (its free
  part), summed over ranks (``srt/entrypoints/http_server.py``). SGLang reports
  no preemption (retraction) counter there: ``preemptions`` is ``None``.

A report that does not parse, misses a series, or holds a value that cannot be
(negative, not finite, a usage above 1) is *garbage*: :func:`parse_report`
returns ``None`` for it and the caller treats it as no report at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from trioforward.http import ConnectionPool, PoolError

__all__ = ["LoadReport", "LOAD_PATH", "parse_report", "parse_vllm_metrics", "parse_sglang_load", "read_load"]

#: Each kind's load route (``openai`` engines report nothing).
LOAD_PATH = {"vllm": "/metrics", "sglang": "/get_load"}

_SERIES = {
    b"vllm:num_requests_running": "running",
    b"vllm:num_requests_waiting": "waiting",
    b"vllm:kv_cache_usage_perc": "usage",
    b"vllm:num_preemptions_total": "preemptions",
}


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One load report: ``running`` and ``waiting`` sequences (ints >= 0),
    ``kv_usage`` (fraction 0..1 of the KV cache in use; ``None`` when not
    reported), ``preemptions`` (the engine's cumulative count; ``None``: not
    reported)."""

    running: int
    waiting: int
    kv_usage: float | None
    preemptions: float | None

    @property
    def busy(self) -> int:
        """Sequences on the engine: running + waiting."""
        return self.running + self.waiting


def _sane(value: float, upper: float = math.inf) -> bool:
    return math.isfinite(value) and 0 <= value <= upper


def parse_vllm_metrics(text: bytes) -> LoadReport | None:
    """The :class:`LoadReport` of a vLLM ``/metrics`` body, or ``None`` (garbage)."""
    found: dict[str, float] = {}
    ranks: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith(b"vllm:"):
            continue
        if b"{" in line:  # name{labels} value [timestamp]
            name, _, rest = line.partition(b"{")
            parts = rest.partition(b"}")[2].split()
        else:  # name value [timestamp]
            name, *parts = line.split()
        field = _SERIES.get(name.strip())
        if field is None:
            continue
        try:
            value = float(parts[0])
        except (IndexError, ValueError):
            return None
        found[field] = found.get(field, 0.0) + value
        ranks[field] = ranks.get(field, 0) + 1
    if "running" not in found or "waiting" not in found:
        return None
    usage = found.get("usage")
    if usage is not None:
        usage /= ranks["usage"]  # the mean over ranks (each has its own KV cache)
    return _report(found["running"], found["waiting"], usage, found.get("preemptions"))


def parse_sglang_load(body: bytes) -> LoadReport | None:
    """The :class:`LoadReport` of an SGLang ``/get_load`` body, or ``None`` (garbage)."""
    try:
        ranks: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(ranks, dict):
        ranks = [ranks]
    if not isinstance(ranks, list) or not ranks:
        return None
    reqs = waiting = tokens = free = 0.0
    for rank in ranks:
        if not isinstance(rank, dict):
            return None
        try:
            reqs += float(rank["num_reqs"])
            waiting += float(rank["num_waiting_reqs"])
            tokens += float(rank.get("num_tokens", 0))
            free += float(rank.get("num_pending_tokens", 0))
        except (KeyError, TypeError, ValueError):
            return None
    usage = (1.0 - free / tokens) if tokens > 0 else None
    return _report(reqs - waiting, waiting, usage, None)


def _report(running: float, waiting: float, usage: float | None, preemptions: float | None) -> LoadReport | None:
    if not (_sane(running) and _sane(waiting)):
        return None
    if usage is not None and not _sane(usage, 1.0 + 1e-6):
        return None
    if preemptions is not None and not _sane(preemptions):
        return None
    return LoadReport(round(running), round(waiting), usage, preemptions)


def parse_report(kind: str, body: bytes) -> LoadReport | None:
    """The report of an engine of ``kind`` (``vllm`` / ``sglang``), or ``None``."""
    return parse_vllm_metrics(body) if kind == "vllm" else parse_sglang_load(body)


async def read_load(pool: ConnectionPool, url: str, kind: str, wait_s: float) -> LoadReport | None:
    """One load report of the engine at ``url`` (kind ``vllm`` or ``sglang``),
    asked within ``wait_s`` seconds; ``None`` when it does not answer 200 in
    time or answers garbage. Never raises for the engine's fault."""
    try:
        response = await pool.request("GET", url + LOAD_PATH[kind], deadline=trio.current_time() + wait_s)
    except PoolError:
        return None
    if response.status != 200:
        return None
    return parse_report(kind, response.content)
