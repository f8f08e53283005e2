"""Tinker refusals in ``/metrics`` (docs/server.md, "Metrics (`GET /metrics`)"): each 4xx/5xx of
``asample`` / ``retrieve_future``, and each poll whose hold ran out (408), counts
once in ``trioforward_tinker_rejections_total{route, status, code}``; answers
that gave the client what it asked for count nothing there."""

from __future__ import annotations

from typing import Any

import httpx
import trio
from gateway_harness import open_gateway
from test_futures_http import asample_body, open_session
from test_metrics import scrape

ASAMPLE = "/api/v1/asample"
RETRIEVE = "/api/v1/retrieve_future"
REJECTIONS = "trioforward_tinker_rejections_total"


def rejected(route: str, status: int, code: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return REJECTIONS, (("code", code), ("route", route), ("status", str(status)))


async def poll_until_done(http: httpx.AsyncClient, request_id: str) -> int:
    """Poll until the result comes (200); returns the polls whose hold ran out (408)."""
    ran_out = 0
    with trio.fail_after(30):
        while (answer := await http.post(RETRIEVE, json={"request_id": request_id})).status_code == 408:
            ran_out += 1
    assert answer.status_code == 200
    return ran_out


async def test_asample_and_retrieve_future_refusals_are_counted(engine: Any) -> None:
    knobs: dict[str, Any] = {"max_outstanding": 1, "future_hold": 0.05, "max_retained_futures": 1}
    async with open_gateway(engine.url, api_keys=("k",), **knobs) as gw:
        async with httpx.AsyncClient(base_url=gw.url, headers={"X-API-Key": "k"}) as http:
            session = await open_session(http)
            assert (await http.post(ASAMPLE, json={})).status_code == 400  # curl -d '{}'
            assert (await http.post(ASAMPLE, json={}, headers={"X-API-Key": "no"})).status_code == 401
            assert (await http.post(ASAMPLE, json=asample_body("nope", 0))).status_code == 404
            assert (await http.post(RETRIEVE, json={"request_id": "never"})).status_code == 404
            # Backpressure: one sample outstanding (held by a pause), the next is refused.
            await gw.state.client.pause()
            first = await http.post(ASAMPLE, json=asample_body(session, 0))
            assert first.status_code == 200
            full = await http.post(ASAMPLE, json=asample_body(session, 1))
            assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
            request_id = first.json()["request_id"]
            assert (await http.post(RETRIEVE, json={"request_id": request_id})).status_code == 408
            await gw.state.client.resume()
            polls_ran_out = 1 + await poll_until_done(http, request_id)
            # A second sample delivered evicts the first (max_retained_futures = 1): 410.
            second = (await http.post(ASAMPLE, json=asample_body(session, 1))).json()["request_id"]
            polls_ran_out += await poll_until_done(http, second)
            assert (await http.post(RETRIEVE, json={"request_id": request_id})).status_code == 410
            samples = await scrape(http, gw.url)
    assert {key: value for key, value in samples.items() if key[0] == REJECTIONS} == {
        rejected(ASAMPLE, 400, "invalid_request"): 1,
        rejected(ASAMPLE, 401, "invalid_api_key"): 1,
        rejected(ASAMPLE, 404, "not_found"): 1,
        rejected(ASAMPLE, 429, "queue_full"): 1,
        rejected(RETRIEVE, 404, "not_found"): 1,
        rejected(RETRIEVE, 408, "try_again"): polls_ran_out,
        rejected(RETRIEVE, 410, "gone"): 1,
    }
    # The samples that ran are still counted once each, by their outcome.
    tinker_sample = ("trioforward_gateway_requests_total", (("route", "tinker_sample"), ("status", "200")))
    assert samples[tinker_sample] == 2


async def test_refusals_on_the_engines_abort_routes_are_not_tinker_rejections(engine: Any) -> None:
    async with open_gateway(engine.url, api_keys=("k",)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, headers={"X-API-Key": "k"}) as http:
            for path in ("/abort_request", "/inference/v1/abort_requests"):
                assert (await http.post(path, json={}, headers={"X-API-Key": "no"})).status_code == 401
                bad = await http.post(path, content=b"[", headers={"Authorization": "Bearer k"})
                assert bad.status_code == 400
            assert (await http.post(ASAMPLE, json={}, headers={"X-API-Key": "no"})).status_code == 401
            samples = await scrape(http, gw.url)
    assert {key: value for key, value in samples.items() if key[0] == REJECTIONS} == {
        rejected(ASAMPLE, 401, "invalid_api_key"): 1,  # only the Tinker call's
    }
