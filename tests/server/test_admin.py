"""Admin API: engines, pause/resume (weight-update gating), adapters, health."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.lowlevel
from gateway_harness import Gateway, generation_requests, open_gateway, open_sim

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 2}


async def test_health(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.get(gateway.url + "/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["engines"] == 1


async def test_health_degraded_and_503_when_no_engine_is_healthy(fd_baseline: int) -> None:
    # A dead engine: the gateway says "degraded" and requests fail with a 503
    # naming the bound after unhealthy_timeout instead of waiting forever.
    async with open_sim() as engine, open_gateway(
        engine.url, health_interval=0.05, health_failures=1, unhealthy_timeout=0.3
    ) as gw:
        await engine.stop_listening()
        async with httpx.AsyncClient(base_url=gw.url) as client:
            dispatch = gw.app.extensions["trioforward"].client
            with trio.fail_after(10):
                while dispatch.engines.list()[0].healthy:  # no checkpoint before the wait
                    await dispatch._registry.wait_changed()
            health = (await client.get("/health")).json()
            assert health["status"] == "degraded"
            assert health["healthy_engines"] == 0 and health["engines"] == 1
            with trio.fail_after(10):
                response = await client.post("/v1/completions", json=BODY)
            assert response.status_code == 503
            error = response.json()["error"]
            assert error["code"] == "no_engine_available" and "unhealthy_timeout" in error["message"]
            assert error["attempts"] == 0


async def test_add_and_remove_engines(engine: Any, fd_baseline: int) -> None:
    async with open_sim() as second, open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url) as client:
            added = await client.post("/admin/engines", json={"url": second.url})
            assert added.status_code == 201
            assert {e["url"] for e in added.json()["engines"]} == {engine.url, second.url}
            bad = await client.post("/admin/engines", json={"url": "ftp://x"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "url"
            removed = await client.request("DELETE", "/admin/engines", json={"url": engine.url})
            assert removed.status_code == 200
            assert [e["url"] for e in removed.json()["engines"]] == [second.url]
            missing = await client.request("DELETE", "/admin/engines", params={"url": engine.url})
            assert missing.status_code == 404
            response = await client.post("/v1/completions", json=BODY)
            assert response.status_code == 200
        assert generation_requests(second) == 1
        assert generation_requests(engine) == 0


async def test_pause_holds_requests_until_resume(engine: Any, gateway: Gateway) -> None:
    results: list[int] = []
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        paused = await client.post("/admin/pause", json={"engines": [engine.url], "mode": "wait"})
        assert paused.status_code == 200
        assert paused.json()["engines"][0]["paused"] is True

        async def one() -> None:
            response = await client.post("/v1/completions", json=BODY)
            results.append(response.status_code)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)
            with trio.fail_after(10):
                while gateway.state.client.statistics().queued < 3:
                    await trio.testing.wait_all_tasks_blocked()
                    await trio.lowlevel.checkpoint()
            assert generation_requests(engine) == 0
            resumed = await client.post("/admin/resume", json={})
            assert resumed.status_code == 200
    assert results == [200, 200, 200]
    assert generation_requests(engine) == 3


async def test_pause_rejects_a_bad_mode(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        response = await client.post("/admin/pause", json={"mode": "later"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "mode"


async def test_adapters_are_registered_and_listed_as_models(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        created = await client.post("/admin/adapters", json={"name": "lora-a", "path": "/adapters/a", "parent": "sim-base"})
        assert created.status_code == 201
        bad = await client.post("/admin/adapters", json={"name": "lora-b"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "path"
        listed = await client.get("/admin/adapters")
        models = await client.get("/v1/models")
    assert listed.json()["adapters"] == [{"name": "lora-a", "path": "/adapters/a", "parent": "sim-base"}]
    by_id = {m["id"]: m for m in models.json()["data"]}
    assert by_id["lora-a"]["parent"] == "sim-base"
    assert "sim-base" in by_id


async def test_pause_abort_ends_in_flight_requests_with_503(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=50) as engine, open_gateway(engine.url) as gw:
        results: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:

            async def one() -> None:
                body = {"model": "sim-base", "prompt": "x", "max_tokens": 1000}
                results.append(await client.post("/v1/completions", json=body))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                with trio.fail_after(10):
                    await engine.stats.wait_for(lambda s: s.running == 1)
                paused = await client.post("/admin/pause", json={"mode": "abort"})
                assert paused.status_code == 200
            with trio.fail_after(10):
                await engine.stats.wait_for(lambda s: s.aborted == 1)
            await client.post("/admin/resume", json={})
        assert await gw.pool_active() == 0
    assert [r.status_code for r in results] == [503]
    error = results[0].json()["error"]
    assert error["code"] == "aborted"
    assert error["engine"] == engine.url
    assert generation_requests(engine) == 1


async def test_admin_changes_are_logged_one_line_each(
    engine: Any, caplog: Any, fd_baseline: int
) -> None:
    # An operator must find each pause, resume and engine change in the log, with
    # its answer and how long it took; reads are not logged, and a client's
    # newline cannot forge a second line.
    caplog.set_level("INFO", logger="trioforward.admin")
    async with open_gateway(engine.url) as gw, httpx.AsyncClient(base_url=gw.url) as client:
        assert (await client.post("/admin/pause", content=b'{"mode": "wait"}')).status_code == 200
        resumed = await client.post("/admin/resume", content=b'{"weight_version": "step-1"}')
        assert resumed.status_code == 200
        bad = await client.post("/admin/pause", content=b'{"mode": "now"}\nINFO forged')
        assert bad.status_code == 400
        assert (await client.get("/admin/engines")).status_code == 200
        gone = await client.delete("/admin/engines", params={"url": "http://127.0.0.1:9"})
        assert gone.status_code == 404
        # A URL with credentials is refused, and its password is not logged.
        secret = {"url": "http://trainer:s3cret@127.0.0.1:9"}
        assert (await client.post("/admin/engines", json=secret)).status_code == 400
        params = {"url": "http://trainer:s3cret@127.0.0.1:9"}
        assert (await client.delete("/admin/engines", params=params)).status_code == 400
    lines = [r.getMessage() for r in caplog.records if r.name == "trioforward.admin"]
    assert len(lines) == 6, lines
    assert not any("s3cret" in line or "trainer" in line for line in lines), lines
    assert "http://***@127.0.0.1:9" in lines[4] and "http%3A%2F%2F***%40127.0.0.1" in lines[5]
    assert lines[0].startswith("POST /admin/pause 200 ")
    assert lines[0].endswith("""s body='{"mode": "wait"}'""")
    assert lines[1].startswith("POST /admin/resume 200 ") and "step-1" in lines[1]
    assert lines[2].startswith("POST /admin/pause 400 ") and "\\nINFO forged" in lines[2]
    assert "\n" not in lines[2]
    assert lines[3].startswith("DELETE /admin/engines?url=http%3A%2F%2F127.0.0.1%3A9 404 ")
    assert lines[3].endswith("s body=-")


async def test_admin_engines_shows_each_kind_and_takes_one(fd_baseline: int) -> None:
    async with open_sim() as vllm, open_sim(kind="sglang") as sglang, open_gateway(vllm.url) as gw:
        dispatch = gw.app.extensions["trioforward"].client
        async with httpx.AsyncClient(base_url=gw.url) as client:
            bad = await client.post("/admin/engines", json={"url": sglang.url, "kind": "tgi"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "kind"
            added = await client.post("/admin/engines", json={"url": sglang.url, "kind": "sglang"})
            assert added.status_code == 201
            with trio.fail_after(10):
                for url in (vllm.url, sglang.url):
                    await dispatch.engines.wait_kind(url)
            engines = (await client.get("/admin/engines")).json()["engines"]
        assert [(e["url"], e["kind"], e["token_route"]) for e in engines] == [
            (vllm.url, "vllm", False),
            (sglang.url, "sglang", True),
        ]
        assert sglang.stats.by_path["/model_info"] == 0  # set, not detected


@pytest.mark.parametrize("version", ["a, b", "step-1,step-2", ","])
async def test_a_weight_version_with_a_comma_is_refused(engine: Any, version: str) -> None:
    # "a, b" was taken, and answers said X-Weight-Version: a, b -- which reads as
    # an answer of two versions (docs/operations.md, "Weight versions").
    async with open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url) as client:
            resumed = await client.post("/admin/resume", json={"weight_version": version})
            added = await client.post("/admin/engines", json={"url": engine.url, "weight_version": version})
            answer = await client.post("/v1/completions", json={"model": "sim-base", "prompt": "x", "max_tokens": 2})
        for refused in (resumed, added):
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["param"] == "weight_version" and "comma" in error["message"]
        assert "x-weight-version" not in answer.headers  # no version was recorded
        with pytest.raises(ValueError, match="comma"):
            await gw.state.client.resume(weight_version=version)
    assert engine.stats.by_path["/resume"] == 0
