"""LoRA adapters loaded on demand, single-flight per (engine, adapter) (docs/dispatch.md, "LoRA adapters")."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.dispatch import ForwardResponse
from trioforward.errors import AdapterLoadError
from trioforward.sim import open_engine

ADAPTERS = {"lora-a": "/adapters/lora-a"}


@pytest.mark.parametrize("routing", ["least-outstanding", "round-robin"])
@pytest.mark.parametrize("unknown_status", [404, 400])
async def test_adapter_race_one_load_per_engine(
    fd_baseline: int, unknown_status: int, routing: str
) -> None:
    async with (
        open_engine(adapter_load_seconds=0.05, unknown_model_status=unknown_status) as e1,
        open_engine(adapter_load_seconds=0.05, unknown_model_status=unknown_status) as e2,
        client_for(e1, e2, routing=routing, adapters=ADAPTERS) as client,
    ):
        results: list[ForwardResponse] = []

        async def one() -> None:
            results.append(await client.post(COMPLETION, json=body(model="lora-a")))

        async with trio.open_nursery() as nursery:
            for _ in range(32):
                nursery.start_soon(one)
        assert [r.status for r in results] == [200] * 32
        assert max(r.attempts for r in results) <= 2
        assert {r.engine for r in results} == {e1.url, e2.url}
        assert sum(r.engine == e1.url for r in results) == 16  # 16 racing on each engine
        for e in (e1, e2):
            assert e.stats.adapter_loads["lora-a"] == 1
            assert e.stats.by_path["/v1/load_lora_adapter"] == 1
            assert completions(e) <= 32  # 16 requests, at most 2 attempts each
        assert client.statistics().adapter_loads == {e1.url: 1, e2.url: 1}
        # Later requests skip the race: one attempt, no new load.
        r = await client.post(COMPLETION, json=body(model="lora-a"))
        assert r.attempts == 1
        assert (
            e1.stats.by_path["/v1/load_lora_adapter"] + e2.stats.by_path["/v1/load_lora_adapter"]
            == 2
        )


async def test_already_loaded_answer_counts_as_success(fd_baseline: int) -> None:
    # The engine has the adapter but our registry has not seen it yet: a stale 404
    # (lazy-resolver race) leads to a load that answers "already been loaded".
    async with (
        open_engine(lora_modules=ADAPTERS) as engine,
        client_for(engine, adapters=ADAPTERS) as client,
    ):
        client._dispatcher.loader.registry.register("lora-a", "/adapters/lora-a")
        engine.faults.reject = 1
        engine.faults.reject_status = 404
        r = await client.post(COMPLETION, json=body(model="lora-a"))
        assert r.status == 200 and r.attempts == 2
        assert engine.stats.by_path["/v1/load_lora_adapter"] == 1
        assert engine.stats.responses[400] == 1  # "has already been loaded"


async def test_lazy_resolver_race_retried_with_backoff(fd_baseline: int) -> None:
    # The filesystem-resolver race: the engine also loads the adapter by itself
    # shortly after the first reference. Whichever load wins, the engine loads it
    # once (the other answers "already been loaded") and the request succeeds.
    async with (
        open_engine(adapters=ADAPTERS, lazy_adapters=0.05) as engine,
        client_for(engine, adapters=ADAPTERS) as client,
    ):
        r = await client.post(COMPLETION, json=body(model="lora-a"))
        assert r.status == 200 and 2 <= r.attempts <= 6
        assert engine.stats.adapter_loads["lora-a"] == 1


async def test_load_endpoint_404_fails_fast_naming_adapter(fd_baseline: int) -> None:
    async with (
        open_engine(runtime_lora=False) as engine,
        client_for(engine, adapters=ADAPTERS) as client,
    ):
        with pytest.raises(AdapterLoadError) as info:
            await client.post(COMPLETION, json=body(model="lora-a"))
        err = info.value
        assert err.adapter == "lora-a" and "lora-a" in str(err)
        assert err.attempts == 1 and err.status == 502
        assert completions(engine) == 1
        assert engine.stats.by_path["/v1/load_lora_adapter"] == 1


async def test_load_of_missing_path_reports_engine_refusal(fd_baseline: int) -> None:
    adapters = {"lora-x": "/adapters/missing-x"}
    async with open_engine() as engine, client_for(engine, adapters=adapters) as client:
        with pytest.raises(AdapterLoadError) as info:
            await client.post(COMPLETION, json=body(model="lora-x"))
        assert "lora-x" in str(info.value) and "missing-x" in str(info.value)
        assert completions(engine) == 1


async def test_base_model_404_not_retried_even_with_adapters(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine, adapters=ADAPTERS) as client:
        r = await client.post(COMPLETION, json=body(model="lora-typo"))
        assert r.status == 404 and r.attempts == 1
        assert engine.stats.by_path["/v1/load_lora_adapter"] == 0


async def test_an_engine_that_lost_an_adapter_gets_it_loaded_again(fd_baseline: int) -> None:
    # As after an engine restart: the load is per engine process, nothing the
    # gateway remembers stops the next request from loading it again.
    async with open_engine() as engine, client_for(engine, adapters=ADAPTERS) as client:
        assert (await client.post(COMPLETION, json=body(model="lora-a"))).attempts == 2
        assert (await client.post(COMPLETION, json=body(model="lora-a"))).attempts == 1
        unload = await client.post("/v1/unload_lora_adapter", json={"lora_name": "lora-a"})
        assert unload.status == 200
        again = await client.post(COMPLETION, json=body(model="lora-a"))
        assert again.status == 200 and again.attempts == 2
        assert engine.stats.by_path["/v1/load_lora_adapter"] == 2
        assert client.statistics().adapter_loads == {engine.url: 2}


async def test_adapter_registry_api(fd_baseline: int) -> None:
    async with client_for() as client:
        client.adapters.register("x", "/p/x")
        assert client.adapters.list() == {"x": "/p/x"} and client.adapters.is_adapter("x")
        client.adapters.unregister("x")
        assert not client.adapters.is_adapter("x")
        with pytest.raises(ValueError):
            client.adapters.register("", "/p")


async def test_concurrent_requests_share_a_failed_load(fd_baseline: int) -> None:
    async with (
        open_engine(runtime_lora=False, adapter_load_seconds=0.05) as engine,
        client_for(engine, adapters=ADAPTERS) as client,
    ):
        errors: list[AdapterLoadError] = []

        async def one() -> None:
            with pytest.raises(AdapterLoadError) as info:
                await client.post(COMPLETION, json=body(model="lora-a"))
            errors.append(info.value)

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
        assert len(errors) == 8 and len({id(e) for e in errors}) == 8
        assert all("lora-a" in str(e) for e in errors)
        # The 404s arrive together: the requests share one (failed) load.
        assert engine.stats.by_path["/v1/load_lora_adapter"] <= 2


async def test_lru_unload_never_takes_an_adapter_in_use(fd_baseline: int) -> None:
    # One adapter slot per engine. A long request keeps lora-a in use while lora-b
    # is loaded: lora-a stays (the engine is over the bound for a while) and its
    # request completes; the next load unloads the least recently used idle one.
    adapters = {n: f"/adapters/{n}" for n in ("lora-a", "lora-b", "lora-c")}
    async with (
        open_engine(decode_ms_per_token=20) as engine,
        client_for(engine, adapters=adapters, max_loaded_adapters=1) as client,
    ):
        results: list[ForwardResponse] = []

        async def one(model: str, tokens: int) -> None:
            results.append(await client.post(COMPLETION, json=body(model=model, max_tokens=tokens)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "lora-a", 50)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await one("lora-b", 1)
            assert set(engine.adapters.loaded) == {"lora-a", "lora-b"}  # a is in use
            assert sum(engine.stats.adapter_unloads.values()) == 0
        await one("lora-c", 1)  # a and b idle now: both go, least recently used first
        assert [r.status for r in results] == [200] * 3
        assert list(engine.adapters.loaded) == ["lora-c"]
        assert engine.stats.adapter_unloads == {"lora-a": 1, "lora-b": 1}
        assert client.statistics().adapters_loaded == {engine.url: ["lora-c"]}
        assert client.statistics().adapter_unloads == {engine.url: 2}


def test_the_registry_forgets_the_least_recently_used_idle_adapter() -> None:
    from trioforward.dispatch.engines._adapters import AdapterRegistry

    registry = AdapterRegistry(limit=2)
    registry.register("a", "/a")
    registry.register("b", "/b")
    registry.in_use["a"] += 1  # a request is using a
    registry.register("c", "/c")
    assert registry.list() == {"a": "/a", "c": "/c"}  # b was the oldest idle one
    registry.touch("a")
    registry.in_use.clear()
    registry.register("d", "/d")
    assert registry.list() == {"a": "/a", "d": "/d"} and registry.dropped == 2


def test_a_parent_goes_with_its_adapter_and_within_the_registry_bound() -> None:
    from trioforward.dispatch.engines._adapters import AdapterRegistry

    registry = AdapterRegistry(limit=2)
    for step in range(3):
        registry.register(f"step{step}", f"/w/{step}", parent="base")
    assert registry.list() == {"step1": "/w/1", "step2": "/w/2"}
    assert [registry.parent(f"step{i}") for i in range(3)] == [None, "base", "base"]
    registry.register("step2", "/w/2")  # a re-registration without a parent clears it
    registry.unregister("step1")
    assert (registry.parent("step1"), registry.parent("step2")) == (None, None)


async def test_adapters_over_the_bound_are_trimmed_as_requests_release_them(fd_baseline: int) -> None:
    # Two slots, five adapters. Six requests at once load all five (each in use:
    # allowed over the bound); as they finish the engine comes back within it
    # without waiting for another load, and stays within it at rest after 60
    # more requests two at a time (strict LRU: each of those reloads its adapter).
    names = [f"lora-{i}" for i in range(5)]
    adapters = {n: f"/adapters/{n}" for n in names}
    async with (
        open_engine(decode_ms_per_token=5) as engine,
        client_for(engine, adapters=adapters, max_loaded_adapters=2) as client,
    ):
        async def one(model: str, tokens: int = 1) -> None:
            response = await client.post(COMPLETION, json=body(model=model, max_tokens=tokens))
            assert response.status == 200

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(one, names[i % 5], 40)
            await engine.stats.wait_for(lambda s: s.running == 6)
            assert len(engine.adapters.loaded) == 5  # all in use
        await trio.testing.wait_all_tasks_blocked()
        assert len(engine.adapters.loaded) <= 2
        assert len(client.statistics().adapters_loaded[engine.url]) <= 2

        for round_ in range(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, names[(2 * round_) % 5])
                nursery.start_soon(one, names[(2 * round_ + 1) % 5])
        await trio.testing.wait_all_tasks_blocked()
        loaded = client.statistics().adapters_loaded[engine.url]
        assert len(loaded) <= 2 and set(loaded) == set(engine.adapters.loaded)
        loads = engine.stats.by_path["/v1/load_lora_adapter"]
        unloads = sum(engine.stats.adapter_unloads.values())
        assert loads - unloads == len(loaded)  # every load beyond the bound was undone
        print(f"loads {loads} unloads {unloads} for 66 requests")
