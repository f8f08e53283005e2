"""examples/embedded_trainer.py (the example of docs/embedding.md) runs as written."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import trio

from trioforward.sim import open_engine

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "embedded_trainer.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("embedded_trainer", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_example_trains_against_a_simulated_engine(fd_baseline: int) -> None:
    example = load_example()
    async with open_engine(capacity=8, decode_ms_per_token=0.5) as engine:
        with trio.fail_after(60):
            history = await example.train([engine.url], "sim-base", steps=2, batch=8)
            # The client closed every upstream connection when it exited.
            await engine.stats.wait_for(lambda s: s.connections_open == 0)
        assert len(history) == 2 and all(0.0 <= r <= 1.0 for r in history)
        assert engine.stats.completed == 16  # 2 steps x 8 prompts, one request each (n=4 inside)
        assert engine.stats.aborted == 0


async def test_example_main_starts_its_own_simulated_fleet(fd_baseline: int) -> None:
    example = load_example()
    with trio.fail_after(60):
        history = await example.main(["--steps", "1"])
    assert len(history) == 1


def test_the_documented_entry_points_are_listed_by_dir() -> None:
    # open_client and Client are imported lazily (module __getattr__); dir(),
    # help() and completion must still show them.
    import trioforward

    names = dir(trioforward)
    assert "open_client" in names and "Client" in names
    assert set(trioforward.__all__) <= set(names)
