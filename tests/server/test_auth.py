"""Client API keys (Bearer on /v1, X-API-Key on /api/v1) and the admin token."""

from __future__ import annotations

from typing import Any

import httpx
import openai
from gateway_harness import generation_requests, open_gateway

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 2}


async def test_api_keys_guard_the_openai_paths(engine: Any) -> None:
    async with open_gateway(engine.url, api_keys="k1,k2") as gw:
        async with httpx.AsyncClient(base_url=gw.url) as client:
            none = await client.post("/v1/completions", json=BODY)
            wrong = await client.post("/v1/completions", json=BODY, headers={"Authorization": "Bearer nope"})
            models = await client.get("/v1/models")
            good = await client.post("/v1/completions", json=BODY, headers={"Authorization": "Bearer k2"})
        async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="k1", max_retries=0) as sdk:
            completion = await sdk.completions.create(model="sim-base", prompt="x", max_tokens=2)
        async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="bad", max_retries=0) as sdk:
            try:
                await sdk.completions.create(model="sim-base", prompt="x", max_tokens=2)
            except openai.AuthenticationError as exc:
                assert exc.status_code == 401
            else:
                raise AssertionError("a bad key was accepted")
    for response in (none, wrong, models):
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
    assert good.status_code == 200
    assert completion.choices
    assert generation_requests(engine) == 2


async def test_api_keys_guard_the_tinker_paths_with_x_api_key(engine: Any) -> None:
    async with open_gateway(engine.url, api_keys="k1") as gw:
        async with httpx.AsyncClient(base_url=gw.url) as client:
            bare = await client.post("/api/v1/create_session", json={})
            bearer_only_v1 = await client.post("/api/v1/create_session", json={}, headers={"X-API-Key": "zz"})
            keyed = await client.get("/api/v1/healthz", headers={"X-API-Key": "k1"})
            health = await client.get("/health")
    assert bare.status_code == 401 and "error" in bare.json()
    assert bearer_only_v1.status_code == 401
    assert keyed.status_code != 401
    assert health.status_code == 200


async def test_admin_token_guards_admin_paths(engine: Any) -> None:
    async with open_gateway(engine.url, admin_token="s3cret", api_keys="k1") as gw:
        async with httpx.AsyncClient(base_url=gw.url) as client:
            denied = await client.get("/admin/engines")
            client_key = await client.get("/admin/engines", headers={"Authorization": "Bearer k1"})
            allowed = await client.get("/admin/engines", headers={"Authorization": "Bearer s3cret"})
            metrics = await client.get("/metrics")
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    assert client_key.status_code == 401
    assert allowed.status_code == 200
    assert [e["url"] for e in allowed.json()["engines"]] == [engine.url]
    assert metrics.status_code == 200


async def test_an_unknown_caller_gets_401_before_405(engine: Any) -> None:
    # The key is checked first on every route: no method hints to a caller without one.
    async with open_gateway(engine.url, api_keys="k1") as gw:
        async with httpx.AsyncClient(base_url=gw.url) as client:
            fast_path = await client.get("/v1/completions")
            keyed = await client.get("/v1/completions", headers={"Authorization": "Bearer k1"})
    assert fast_path.status_code == 401
    assert keyed.status_code == 405 and keyed.headers["allow"] == "POST"


def test_every_engine_control_route_takes_the_admin_token() -> None:
    # The front's auth check lists the engines' control paths itself (it may not
    # import the route packages above it): one added to engine_api/ but not
    # there would be open to anyone.
    from quart_trio import QuartTrio

    from trioforward import Settings
    from trioforward.dispatch import TenantTable
    from trioforward.server.base._errors import RequestError
    from trioforward.server.engine_api import install_engine_routes
    from trioforward.server.front._auth import check_auth

    app = QuartTrio(__name__)
    install_engine_routes(app)
    paths = {rule.rule for rule in app.url_map.iter_rules() if rule.endpoint != "static"}
    settings = Settings(admin_token="s3cret")
    tenants = TenantTable(settings)
    refused = []
    for path in sorted(paths):
        try:
            check_auth(settings, path, lambda name: None, tenants)
        except RequestError as err:
            refused.append((path, err.status))
    assert len(paths) >= 15 and refused == [(path, 401) for path in sorted(paths)]
