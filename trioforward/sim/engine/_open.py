"""``open_engine`` / ``open_fleet``: simulated engines as async context managers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TypedDict, Unpack

from trioforward._background import open_background_nursery
from trioforward.sim.engine._engine import SimEngine
from trioforward.sim.physics._physics import EngineProfile

__all__ = ["EngineOptions", "open_engine", "open_fleet"]


class EngineOptions(TypedDict, total=False):
    """Keyword options of :class:`SimEngine` / ``open_engine`` (defaults on ``SimEngine``)."""

    host: str
    port: int
    capacity: int
    prefill_ms_per_token: float
    decode_ms_per_token: float
    models: Collection[str]
    adapters: Mapping[str, str] | None
    lora_modules: Mapping[str, str] | None
    lazy_adapters: float | None
    keep_alive: float | None
    runtime_lora: bool
    unknown_model_status: int
    missing_paths: Collection[str]
    adapter_load_seconds: float
    max_model_len: int | None
    backlog: int
    prefix_cache_tokens: int
    block_size: int
    kind: str
    health_check_timeout: float
    scale_out: bool
    profile: str | EngineProfile | None
    kv_cache_tokens: int
    time_scale: float
    max_num_seqs: int | None


@asynccontextmanager
async def open_engine(**options: Unpack[EngineOptions]) -> AsyncIterator[SimEngine]:
    """Run a simulated engine listening on ``host:port`` (0 = any free port) for the block.

    Options (:class:`EngineOptions`, defaults as :class:`SimEngine`):

    - ``capacity``: requests run at once (vLLM ``max_num_seqs``; 0 = unlimited).
    - ``prefill_ms_per_token`` / ``decode_ms_per_token``: the timing model (ms; 0 = instant).
    - ``models``: base model names; ``adapters``: adapters the engine can find
      (name → path; lazy mode loads them by itself); ``lora_modules``: adapters
      loaded at start (name → path).
    - ``lazy_adapters``: seconds after its first request an unloaded, findable
      adapter loads by itself (None = no lazy loading; 0 = the first request
      loads it and is answered, as vLLM's filesystem resolver).
    - ``keep_alive``: idle keep-alive timeout (s; None = never). ``runtime_lora``: False = the
      load/unload endpoints answer 404 ``{"detail": "Not Found"}``.
    - ``unknown_model_status``: 404 (default) or 400 for an unknown model/adapter.
    - ``missing_paths``: adapter paths that do not exist (so does any path containing "missing").
    - ``adapter_load_seconds``: time a load request takes.
    - ``prefix_cache_tokens``: capacity of the prefix cache in tokens (0 = no cache);
      ``block_size``: its block size in tokens (default 16, as vLLM).
    - ``max_model_len``: the model length in tokens (None = unlimited): a longer
      prompt is refused with vLLM's 400, prompt + ``max_tokens`` beyond it is cut.
    - ``kind``: which engine it is: ``"vllm"`` (default: vLLM 0.32 with its
      dev-mode ``/pause``, ``/resume``, ...), ``"none"`` (vLLM without dev mode),
      ``"sglang"`` (SGLang's native API: ``/model_info``, ``/ready``,
      ``/pause_generation``, ...) or ``"openai"`` (an OpenAI-compatible server
      with nothing else; docs/sim.md, "Weight updates").
    - ``health_check_timeout``: ``"sglang"``: seconds ``/health`` waits while
      paused before answering 503 (SGLang's 20 s).
    - ``profile``: the engine model (docs/sim.md, "Engine model"): a name in
      ``PROFILES`` (``"vllm-cpu-tiny"``, ``"h100-llama3-8b"``) or an
      ``EngineProfile``; None (default) keeps the per-token timing above.
      ``kv_cache_tokens``: its KV budget in tokens (0 = unlimited; needs a
      profile); ``time_scale``: wall seconds per modelled second (> 0; 0.01 runs
      100x faster); ``max_num_seqs``: vLLM's name for ``capacity``.
    - ``scale_out``: a vLLM kind also serves ``POST /inference/v1/generate`` and
      ``POST /inference/v1/abort_requests`` (vLLM 0.32's ``--enable-scale-out``).

    On exit every connection is closed and background work is cancelled.
    Raises ``OSError`` if the port cannot be bound.
    """
    async with open_background_nursery() as nursery:
        engine = SimEngine(nursery, **options)
        await engine.start_listening()
        yield engine


@asynccontextmanager
async def open_fleet(n: int, **options: Unpack[EngineOptions]) -> AsyncIterator[list[SimEngine]]:
    """Run ``n`` simulated engines (each on its own free port) with the same ``options``."""
    if options.get("port"):
        raise ValueError("open_fleet picks free ports; do not pass port")
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(open_engine(**options)) for _ in range(n)]
        yield engines
