"""LoRA adapters: runtime load/unload, duplicates, missing paths, lazy self-loading."""

from __future__ import annotations

import pytest
import trio
from simclient import request

from trioforward.sim import open_engine

LOAD = "/v1/load_lora_adapter"
UNLOAD = "/v1/unload_lora_adapter"


async def test_load_use_unload(fd_baseline: int) -> None:
    async with open_engine() as engine:
        before = await request(
            engine, "POST", "/v1/completions", {"model": "lora-a", "prompt": [1]}
        )
        assert before.status == 404
        loaded = await request(
            engine, "POST", LOAD, {"lora_name": "lora-a", "lora_path": "/ckpt/a"}
        )
        assert (
            loaded.status == 200
            and loaded.body == b"Success: LoRA adapter 'lora-a' added successfully."
        )
        after = await request(engine, "POST", "/v1/completions", {"model": "lora-a", "prompt": [1]})
        assert after.status == 200 and after.json()["model"] == "lora-a"
        models = (await request(engine, "GET", "/v1/models")).json()["data"]
        assert {"id": "lora-a", "root": "/ckpt/a", "parent": "sim-base"}.items() <= models[
            -1
        ].items()
        unloaded = await request(engine, "POST", UNLOAD, {"lora_name": "lora-a"})
        assert unloaded.status == 200
        assert (await request(engine, "POST", UNLOAD, {"lora_name": "lora-a"})).status == 404
        gone = await request(engine, "POST", "/v1/completions", {"model": "lora-a", "prompt": [1]})
        assert gone.status == 404
        assert engine.stats.adapter_loads == {"lora-a": 1}
        assert engine.stats.adapter_unloads == {"lora-a": 1}
        assert engine.stats.by_model == {"lora-a": 3}


async def test_duplicate_load_is_400_already_loaded(fd_baseline: int) -> None:
    async with open_engine(lora_modules={"pre": "/ckpt/pre"}) as engine:
        dup = await request(engine, "POST", LOAD, {"lora_name": "pre", "lora_path": "/ckpt/pre"})
        assert dup.status == 400
        assert dup.json()["error"]["type"] == "InvalidUserInput"
        assert dup.json()["error"]["message"].startswith(
            "The lora adapter 'pre' has already been loaded."
        )
        assert (
            await request(engine, "POST", "/v1/completions", {"model": "pre", "prompt": [1]})
        ).status == 200
        assert engine.stats.adapter_loads == {}


@pytest.mark.parametrize("status", [404, 400])
async def test_missing_path_and_unknown_model_status_is_selectable(
    fd_baseline: int, status: int
) -> None:
    async with open_engine(unknown_model_status=status, missing_paths={"/gone"}) as engine:
        # vLLM 0.32 sanitizes error messages: a path under /tmp, /home, ... reads <path>
        for path, shown in (("/gone", "/gone"), ("/tmp/ckpt/missing-one", "<path>")):
            reply = await request(engine, "POST", LOAD, {"lora_name": "x", "lora_path": path})
            assert reply.status == status
            message = reply.json()["error"]["message"]
            assert message == f"Loading lora x failed: No adapter found for {shown}"
        unknown = await request(engine, "POST", "/v1/completions", {"model": "x", "prompt": [1]})
        assert unknown.status == status
        assert unknown.json()["error"]["message"] == (
            "The model `x` does not exist. Valid aliases: sim-base, sim-base-2."
        )
        bad = await request(engine, "POST", LOAD, {"lora_name": "x"})
        assert bad.status == 400
        assert engine.stats.adapter_loads == {}


async def test_runtime_loading_disabled_is_plain_404(fd_baseline: int) -> None:
    async with open_engine(runtime_lora=False) as engine:
        for path in (LOAD, UNLOAD):
            reply = await request(engine, "POST", path, {"lora_name": "x", "lora_path": "/p"})
            assert reply.status == 404 and reply.json() == {"detail": "Not Found"}


async def test_lazy_adapter_loads_itself_after_first_reference(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(lazy_adapters=3.0, adapters={"lazy": "/ckpt/lazy"}) as engine:
        start = trio.current_time()
        first = await request(engine, "POST", "/v1/completions", {"model": "lazy", "prompt": [1]})
        assert first.status == 404
        # not findable: never loads
        assert (
            await request(engine, "POST", "/v1/completions", {"model": "other", "prompt": [1]})
        ).status == 404
        await engine.stats.wait_for(lambda s: s.lazy_loads["lazy"] == 1)
        assert trio.current_time() - start == pytest.approx(3.0)
        assert (
            await request(engine, "POST", "/v1/completions", {"model": "lazy", "prompt": [1]})
        ).status == 200
        dup = await request(engine, "POST", LOAD, {"lora_name": "lazy", "lora_path": "/ckpt/lazy"})
        assert dup.status == 400  # the race the gateway must treat as success
        assert engine.stats.adapter_loads == {"lazy": 1} and "other" not in engine.adapters.loaded


async def test_lazy_mode_without_registry_finds_any_name_but_missing(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(lazy_adapters=1.0) as engine:
        await request(engine, "POST", "/v1/completions", {"model": "anything", "prompt": [1]})
        await request(engine, "POST", "/v1/completions", {"model": "missing-one", "prompt": [1]})
        await engine.stats.wait_for(lambda s: s.lazy_loads["anything"] == 1)
        await trio.sleep(2)
        assert set(engine.adapters.loaded) == {"anything"}


async def test_load_takes_adapter_load_seconds(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(adapter_load_seconds=2.0) as engine:
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            replies = []

            async def load() -> None:
                replies.append(
                    await request(engine, "POST", LOAD, {"lora_name": "a", "lora_path": "/a"})
                )

            nursery.start_soon(load)
            nursery.start_soon(load)
        assert sorted(r.status for r in replies) == [200, 400]
        assert trio.current_time() - start == pytest.approx(2.0)
        assert engine.stats.adapter_loads == {"a": 1}
