"""Tenants on the engines' own token routes, POST /generate (SGLang) and POST
/inference/v1/generate (vLLM): the API key names the tenant, each engine's queue
is fair between tenants and a tenant over its max_outstanding gets 429
``tenant_queue_full`` with Retry-After in the route's error shape (docs/server.md,
"Token routes"; docs/dispatch.md, "Tenants and fair queueing")."""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import pytest
import trio
import trio.testing
from gateway_harness import open_gateway, open_sim

KEYS = {"a": "sk-token-a-0123456789", "b": "sk-token-b-9876543210"}
TENANTS = {"a": {"keys": [KEYS["a"]], "max_outstanding": 12}, "b": {"keys": [KEYS["b"]]}}
ROUTES = {
    "sglang": ("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}),
    "vllm": ("/inference/v1/generate", {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}}),
}


async def until(predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds, re-checked whenever every task is blocked."""
    with trio.fail_after(30):  # a hang guard only
        while not predicate():
            await trio.testing.wait_all_tasks_blocked(0.01)
            await trio.lowlevel.checkpoint()


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_token_routes_are_fair_between_tenants_and_limit_each(kind: str, fd_baseline: int) -> None:
    path, body = ROUTES[kind]
    engine_kind = {"kind": "sglang"} if kind == "sglang" else {"scale_out": True}
    async with (
        open_sim(**engine_kind) as engine,
        open_gateway(engine.url, tenants=TENANTS, engine_capacity=2) as gw,
    ):
        client = gw.state.client
        with trio.fail_after(10):
            await client.engines.wait_kind(engine.url)
        probes = engine.stats.by_path[path]  # the kind detection's POST {}
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            engine.prefill_stall(math.inf)  # the first two hold the slots
            answers: dict[str, list[httpx.Response]] = {"a": [], "b": []}
            b_done: list[int] = []  # A's requests still queued when B's last answer came

            async def post(tenant: str) -> None:
                auth = {"Authorization": f"Bearer {KEYS[tenant]}"}
                answers[tenant].append(await http.post(path, json=body, headers=auth))
                if tenant == "b" and len(answers["b"]) == 2:
                    b_done.append(client.statistics().tenants["a"].queued)

            async with trio.open_nursery() as nursery:
                for _ in range(12):
                    nursery.start_soon(post, "a")
                await until(lambda: client.statistics().tenants["a"].outstanding == 12)
                full = await http.post(path, json=body, headers={"Authorization": f"Bearer {KEYS['a']}"})
                for _ in range(2):
                    nursery.start_soon(post, "b")
                await until(lambda: client.statistics().queued == 12)
                engine.end_stall()
        assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1
        error = full.json()["error"]  # the gateway's own errors keep the /v1 shape on these routes
        assert error["code"] == "tenant_queue_full" and "'a'" in error["message"]
        assert error["phase"] == "queued" and error["attempts"] == 0
        assert [r.status_code for r in answers["a"] + answers["b"]] == [200] * 14
        # B arrived behind A's ten queued requests and was served before most of them.
        assert b_done and b_done[0] >= 4, b_done
        assert engine.stats.by_path[path] - probes == 14  # the refused one never reached it
        stats = client.statistics().tenants
        assert stats["a"].served == 12 and stats["a"].rejections == 1
        assert stats["b"].served == 2 and stats["b"].rejections == 0
