"""The simulated SGLang's information and readiness routes (docs/sim.md, "SGLang kind").

As SGLang 0.5.23 answers them (``srt/entrypoints/http_server.py``; the facts and
their sources are in docs/compatibility.md, "SGLang engines"):

- ``GET /model_info`` → ``{"model_path", "served_model_name", "tokenizer_path",
  "is_generation": true, "preferred_sampling_params": null, "weight_version", ...}``
  (``weight_version`` ``"default"`` until set);
- ``GET /server_info`` → the server arguments that change wire behaviour
  (``incremental_streaming_output``: false, ``stream_interval``: 1,
  ``skip_tokenizer_init``, ``enable_metrics``, ``max_running_requests``), the
  scheduler's ``max_total_num_tokens``, ``version`` and ``frontend: "python"``;
- ``GET /ready`` → 200 empty when not paused, 503 while paused;
- ``GET /health`` → 200 empty, but while paused it waits (SGLang submits a
  one-token probe, which waits like any request) and answers 503 after
  ``health_check_timeout`` seconds (``SGLANG_HEALTH_CHECK_TIMEOUT``, 20 s);
- ``GET /v1/loads`` → ``{"timestamp", "version", "loads": [{"dp_rank": 0,
  "num_running_reqs", "num_waiting_reqs", "max_running_requests", ...}]}``
  (``srt/entrypoints/v1_loads.py``);
- ``GET /get_weight_version`` → 404 (removed in 0.5.21).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

import orjson
import trio

if TYPE_CHECKING:
    from trioforward.sim.engine._engine import SimEngine

__all__ = ["INFO_PATHS", "SGLANG_VERSION", "serve_info"]

#: The SGLang release the sim models (docs/compatibility.md, "SGLang engines").
SGLANG_VERSION = "0.5.23"
INFO_PATHS = frozenset({"/model_info", "/server_info", "/ready", "/health", "/v1/loads"})
_JSON = b"application/json"

Answer = tuple[int, bytes, bytes]


def weight_version(engine: SimEngine) -> str:
    """What SGLang reports as ``weight_version`` (``"default"`` until one is set)."""
    version = engine.rl.weight_version
    return "default" if version is None else version


def _model_info(engine: SimEngine) -> dict[str, Any]:
    base = engine.adapters.base[0]
    return {
        # The last /update_weights_from_disk's path (_weight_push.py); the served
        # name stays (the sim's adapters hang off it).
        "model_path": engine.model_path or base,
        "served_model_name": base,
        "tokenizer_path": base,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": weight_version(engine),
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "sim",
        "architectures": ["SimForCausalLM"],
    }


def _server_info(engine: SimEngine) -> dict[str, Any]:
    base = engine.adapters.base[0]
    return {
        "model_path": base,
        "served_model_name": base,
        "incremental_streaming_output": False,
        "stream_interval": 1,
        "skip_tokenizer_init": False,
        "enable_metrics": False,
        "enable_lora": engine.adapters.runtime_lora,
        "max_running_requests": engine.capacity or None,
        "max_total_num_tokens": engine.max_model_len or 1 << 20,
        "max_req_input_len": engine.max_model_len or 1 << 20,
        "internal_states": [{"last_gen_throughput": 0.0}],
        "version": SGLANG_VERSION,
        "frontend": "python",
    }


def _loads(engine: SimEngine) -> dict[str, Any]:
    stats = engine.stats
    # with a profile, the engine model's KV use and prefix-cache hit rate (docs/sim.md, "Load reports")
    usage = engine.scheduler.kv.usage() if engine.scheduler is not None else 0.0
    queried = stats.prompt_tokens_computed + stats.prompt_tokens_cached
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "version": SGLANG_VERSION,
        "accelerator": "sim",
        "num_accelerators": 1,
        "loads": [
            {
                "dp_rank": 0,
                "num_running_reqs": stats.running,
                "num_waiting_reqs": stats.queued + stats.held,
                "max_running_requests": engine.capacity,
                "token_usage": usage,
                "gen_throughput": 0.0,
                "cache_hit_rate": stats.prompt_tokens_cached / queried if queried else 0.0,
            }
        ],
    }


async def serve_info(engine: SimEngine, path: str) -> Answer:
    """Answer ``GET path`` (one of :data:`INFO_PATHS`)."""
    if path == "/model_info":
        return 200, _JSON, orjson.dumps(_model_info(engine))
    if path == "/server_info":
        return 200, _JSON, orjson.dumps(_server_info(engine))
    if path == "/v1/loads":
        return 200, _JSON, orjson.dumps(_loads(engine))
    if path == "/ready":
        return (503 if engine.rl.paused else 200), b"", b""
    # /health: a probe generation that waits while paused.
    with trio.move_on_after(engine.health_check_timeout):
        await engine.rl.hold()
        return engine.faults.health_status, b"", b""
    return 503, b"", b""
