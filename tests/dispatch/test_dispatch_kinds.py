"""Engine kinds: detected at registration or set, and what they drive — health
probes, adapter routes, weight-update calls (docs/operations.md, "Engine kinds")."""

from __future__ import annotations

import trio
from dispatch_testing import COMPLETION, body, client_for

from trioforward.dispatch import Client
from trioforward.sim import open_engine


async def kinds(client: Client) -> dict[str, tuple[str | None, bool | None]]:
    with trio.fail_after(10):
        infos = [await client.engines.wait_kind(e.url) for e in client.engines.list()]
    return {i.url: (i.kind, i.token_route) for i in infos}


async def test_each_engine_kind_is_detected_from_its_own_endpoints(fd_baseline: int) -> None:
    async with (
        open_engine() as vllm,
        open_engine(kind="none") as plain_vllm,
        open_engine(kind="sglang") as sglang,
        open_engine(kind="openai") as other,
        open_engine(scale_out=True) as scaled,
        client_for(vllm, plain_vllm, sglang, other, scaled) as client,
    ):
        assert await kinds(client) == {
            vllm.url: ("vllm", False),  # no --enable-scale-out: /inference/v1/generate is 403
            scaled.url: ("vllm", True),  # its validation error to the probe's {}
            plain_vllm.url: ("vllm", False),
            sglang.url: ("sglang", True),
            other.url: ("openai", False),
        }
        assert sglang.stats.by_path["/model_info"] == 1
        assert sglang.stats.by_path["/get_weight_version"] == 0  # gone in SGLang 0.5.21
        assert vllm.stats.by_path["/version"] == 1
        assert other.stats.by_path["/v1/models"] == 1
        assert sglang.stats.by_path[COMPLETION] == 0  # nothing generated to find out
        assert scaled.stats.tokens_decoded == 0 and vllm.stats.tokens_decoded == 0


async def test_an_operator_kind_is_not_detected_and_wins(fd_baseline: int) -> None:
    async with open_engine(kind="sglang") as sglang, open_engine() as vllm:
        async with client_for(
            sglang, vllm, engine_kinds={sglang.url: "sglang", vllm.url: "openai"}
        ) as client:
            assert await kinds(client) == {sglang.url: ("sglang", True), vllm.url: ("openai", False)}
            assert sglang.stats.by_path["/model_info"] == 0 and vllm.stats.by_path["/version"] == 0
            await client.pause(engine_mode="keep")
            # An openai engine is paused at the gateway only: gated, not listed
            # among the engines paused at the engine level.
            assert {u: p.kind for u, p in client.weights.engine_pauses.items()} == {
                sglang.url: "sglang",
            }
            assert {e.url: e.paused for e in client.engines.list()} == {sglang.url: True, vllm.url: True}
            assert vllm.stats.pauses == {}
            await client.resume()
        async with open_engine(kind="openai") as other, client_for(other) as client:
            client.engines.add(vllm.url, "sglang")
            assert (await kinds(client))[vllm.url] == ("sglang", True)


async def test_an_unreachable_engine_is_detected_once_it_answers(fd_baseline: int) -> None:
    async with open_engine(kind="sglang") as engine:
        await engine.stop_listening()
        async with client_for(engine) as client:
            await trio.sleep(0.2)
            assert client.engines.list()[0].kind is None
            await engine.start_listening()
            assert await kinds(client) == {engine.url: ("sglang", True)}


async def test_a_paused_sglang_engine_is_probed_on_ready_and_never_ejected(
    fd_baseline: int,
) -> None:
    async with (
        open_engine(kind="sglang", health_check_timeout=0.05) as engine,
        client_for(engine, health_interval=0.02, health_failures=2, health_timeout=1.0) as client,
    ):
        await kinds(client)
        await client.pause(engine_mode="keep")  # SGLang in_place: /ready answers 503
        await engine.stats.wait_for(lambda s: s.responses[503] >= 5)
        info = client.engines.list()[0]
        assert info.healthy and info.consecutive_failures == 0
        assert engine.stats.by_path["/health"] == 0  # /ready, not the blocking /health
        await client.resume()
        assert (await client.post(COMPLETION, json=body())).status == 200
        await engine.stop_listening()  # an unpaused engine that fails: ejected as any
        with trio.fail_after(10):
            while client.engines.list()[0].healthy:
                await client._registry.wait_changed()  # an ejection ends its eligibility


async def test_sglang_openai_routes_get_base_colon_adapter(fd_baseline: int) -> None:
    """A bare adapter name would be served by SGLang's base model: the request goes
    out as "<served name>:<adapter>", lazily loaded on the 400 it first gets."""
    async with (
        open_engine(kind="sglang") as engine,
        client_for(engine, adapters={"a1": "/adapters/a1"}) as client,
    ):
        await kinds(client)
        for _ in range(2):
            response = await client.post(COMPLETION, json=body(model="a1"))
            assert response.status == 200
        assert engine.stats.by_model["a1"] == 2 and engine.stats.by_model["sim-base"] == 0
        assert engine.stats.by_path["/load_lora_adapter"] == 1
        assert engine.stats.by_path["/v1/completions"] == 3  # the 400 before the load, then 2
        assert orjson_model(response.content) == "sim-base:a1"  # SGLang echoes what it got


def orjson_model(content: bytes) -> str:
    import orjson

    return str(orjson.loads(content)["model"])


async def test_adapters_load_on_sglang_routes_without_v1(fd_baseline: int) -> None:
    async with (
        open_engine(kind="sglang") as engine,
        client_for(engine, adapters={"a1": "/adapters/a1"}, max_loaded_adapters=1) as client,
    ):
        await kinds(client)
        assert (await client.post(COMPLETION, json=body(model="a1"))).status == 200
        client.adapters.register("a2", "/adapters/a2")
        assert (await client.post(COMPLETION, json=body(model="a2"))).status == 200
        assert engine.stats.by_path["/load_lora_adapter"] == 2
        assert engine.stats.by_path["/unload_lora_adapter"] == 1  # a1 evicted (bound 1)
        assert engine.stats.by_path["/v1/load_lora_adapter"] == 0
        assert list(engine.adapters.loaded) == ["a2"]
