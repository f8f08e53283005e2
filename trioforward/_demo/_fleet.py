"""The engines the demo drives: simulated in-process (default), or real ones by URL."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Fleet", "open_fleet", "SIM_CAPACITY", "BASE_MODEL", "ADAPTER_RUN", "ADAPTER_NAME"]

# A small, visibly busy fleet: 16 sequences at once per engine and 12 ms per
# generated token (16 tokens ≈ 0.2 s of engine time), so three engines finish
# ~240 requests/s: steady traffic fits, a burst of thousands queues at the
# gateway, and queue time shows up next to engine time.
SIM_CAPACITY = 16
SIM_DECODE_MS = 12.0
SIM_PREFILL_MS = 0.05
# The simulated engine's lazy adapter resolver: an adapter named in a request
# appears this long after its first reference (the vLLM filesystem-resolver race).
SIM_LAZY_SECONDS = 0.5
BASE_MODEL = "sim-base"
# tinker://demo-run/sampler_weights/step-100 -> adapter "demo-run_step-100" at
# <adapter_root>/demo-run/step-100 (docs/tinker.md, "Models").
ADAPTER_RUN = "demo-run"
ADAPTER_NAME = "step-100"


@dataclass(slots=True)
class Fleet:
    """The engines behind the gateway.

    ``urls`` are their base URLs; ``engines`` the in-process simulated engines
    (empty for real engines, which the demo never stops).
    """

    urls: list[str]
    engines: list[Any] = field(default_factory=list)
    base_model: str = BASE_MODEL
    adapter_root: str | None = None
    stopped: set[int] = field(default_factory=set)

    @property
    def simulated(self) -> bool:
        return bool(self.engines)

    @property
    def adapter_name(self) -> str:
        return f"{ADAPTER_RUN}_{ADAPTER_NAME}"

    @property
    def model_path(self) -> str:
        return f"tinker://{ADAPTER_RUN}/sampler_weights/{ADAPTER_NAME}"

    async def stop(self, index: int) -> None:
        """Kill engine ``index``: its listener and every connection close, and new
        connections are refused until :meth:`start` (the demo drains it first)."""
        await self.engines[index].stop_listening()
        self.stopped.add(index)

    async def start(self, index: int) -> None:
        """Bring a stopped engine back on the same port."""
        await self.engines[index].start_listening()
        self.stopped.discard(index)

    def adapter_loads(self) -> int:
        """Adapter loads the engines counted (load endpoint and lazy loads)."""
        return sum(sum(e.stats.adapter_loads.values()) for e in self.engines)

    def requests_completed(self) -> list[int]:
        return [int(e.stats.completed) for e in self.engines]


@asynccontextmanager
async def open_fleet(
    count: int, external: Sequence[str] = (), adapter_root: str | None = None
) -> AsyncIterator[Fleet]:
    """``count`` simulated engines on free loopback ports, or the ``external`` URLs.

    With simulated engines the LoRA adapter of the demo exists on disk under
    ``adapter_root`` and is loaded lazily by the engines.
    """
    if external:
        yield Fleet(urls=[u.rstrip("/") for u in external])
        return
    from trioforward.sim import open_engine

    assert adapter_root is not None
    adapter_path = os.path.join(adapter_root, ADAPTER_RUN, ADAPTER_NAME)
    os.makedirs(adapter_path, exist_ok=True)
    fleet = Fleet(urls=[], adapter_root=adapter_root)
    async with AsyncExitStack() as stack:
        for _ in range(count):
            engine = await stack.enter_async_context(
                open_engine(
                    port=0,
                    capacity=SIM_CAPACITY,
                    prefill_ms_per_token=SIM_PREFILL_MS,
                    decode_ms_per_token=SIM_DECODE_MS,
                    models=(BASE_MODEL,),
                    adapters={fleet.adapter_name: adapter_path},
                    lazy_adapters=SIM_LAZY_SECONDS,
                )
            )
            fleet.engines.append(engine)
            fleet.urls.append(engine.url)
        yield fleet
