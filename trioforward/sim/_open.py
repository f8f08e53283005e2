"""``open_engine`` / ``open_fleet``: simulated engines as async context managers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

import trio

from trioforward.sim._engine import SimEngine

__all__ = ["open_engine", "open_fleet"]


@asynccontextmanager
async def open_engine(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    capacity: int = 256,
    prefill_ms_per_token: float = 0.0,
    decode_ms_per_token: float = 0.0,
    models: Collection[str] = ("sim-base", "sim-base-2"),
    adapters: Mapping[str, str] | None = None,
    lora_modules: Mapping[str, str] | None = None,
    lazy_adapters: float | None = None,
    keep_alive: float | None = 5.0,
    runtime_lora: bool = True,
    unknown_model_status: int = 404,
    missing_paths: Collection[str] = (),
    adapter_load_seconds: float = 0.0,
    backlog: int = 4096,
) -> AsyncIterator[SimEngine]:
    """Run a simulated engine listening on ``host:port`` (0 = any free port) for the block.

    - ``capacity``: requests run at once (vLLM ``max_num_seqs``; 0 = unlimited).
    - ``prefill_ms_per_token`` / ``decode_ms_per_token``: the timing model (ms; 0 = instant).
    - ``models``: base model names; ``adapters``: adapters the engine can find
      (name → path; lazy mode loads them by itself); ``lora_modules``: adapters
      loaded at start (name → path).
    - ``lazy_adapters``: seconds after its first request an unloaded, findable
      adapter loads by itself (None = no lazy loading).
    - ``keep_alive``: idle keep-alive timeout (s; None = never). ``runtime_lora``: False = the
      load/unload endpoints answer 404 ``{"detail": "Not Found"}``.
    - ``unknown_model_status``: 404 (default) or 400 for an unknown model/adapter.
    - ``missing_paths``: adapter paths that do not exist (so does any path containing "missing").
    - ``adapter_load_seconds``: time a load request takes.

    On exit every connection is closed and background work is cancelled.
    Raises ``OSError`` if the port cannot be bound.
    """
    async with trio.open_nursery() as nursery:
        engine = SimEngine(
            nursery,
            host=host,
            port=port,
            capacity=capacity,
            prefill_ms_per_token=prefill_ms_per_token,
            decode_ms_per_token=decode_ms_per_token,
            models=models,
            adapters=adapters,
            lora_modules=lora_modules,
            lazy_adapters=lazy_adapters,
            keep_alive=keep_alive,
            runtime_lora=runtime_lora,
            unknown_model_status=unknown_model_status,
            missing_paths=missing_paths,
            adapter_load_seconds=adapter_load_seconds,
            backlog=backlog,
        )
        await engine.start_listening()
        try:
            yield engine
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_fleet(n: int, **options: object) -> AsyncIterator[list[SimEngine]]:
    """Run ``n`` simulated engines (each on its own free port) with the same ``options``."""
    if options.get("port"):
        raise ValueError("open_fleet picks free ports; do not pass port")
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(open_engine(**options)) for _ in range(n)]  # type: ignore[arg-type]
        yield engines
