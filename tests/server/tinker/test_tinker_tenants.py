"""Tinker samples and tenants: the X-API-Key names the tenant, its unfinished samples
count against its max_outstanding, and its samples queue in the fair order
(docs/dispatch.md, "Tenants and fair queueing")."""

from __future__ import annotations

from typing import Any

import httpx
from gateway_harness import generation_requests, open_gateway
from test_futures_http import asample_body, open_session
from test_tenants import until
from test_tinker_metrics import poll_until_done

ASAMPLE = "/api/v1/asample"
TENANTS = {"train": {"keys": ["k-train"], "max_outstanding": 1}, "eval": {"keys": ["k-eval"]}}


async def test_a_tenant_over_its_sample_limit_gets_429_while_another_samples(engine: Any) -> None:
    async with open_gateway(engine.url, tenants=TENANTS, future_hold=0.05) as gw:
        client = gw.state.client
        async with (
            httpx.AsyncClient(base_url=gw.url, headers={"X-API-Key": "k-train"}) as train,
            httpx.AsyncClient(base_url=gw.url, headers={"X-API-Key": "k-eval"}) as evaluation,
        ):
            train_session = await open_session(train)
            eval_session = await open_session(evaluation)
            await client.pause()  # the first sample stays unfinished
            first = await train.post(ASAMPLE, json=asample_body(train_session, 0))
            assert first.status_code == 200
            full = await train.post(ASAMPLE, json=asample_body(train_session, 1))
            other = await evaluation.post(ASAMPLE, json=asample_body(eval_session, 0))
            assert other.status_code == 200
            await until(lambda: client.statistics().tenants["eval"].queued == 1)
            await client.resume()
            await poll_until_done(train, first.json()["request_id"])
            await poll_until_done(evaluation, other.json()["request_id"])
            again = await train.post(ASAMPLE, json=asample_body(train_session, 1))  # room again
            await poll_until_done(train, again.json()["request_id"])
    assert full.status_code == 429
    assert full.json()["error"]["code"] == "tenant_queue_full"
    assert int(full.headers["retry-after"]) >= 1
    assert generation_requests(engine) == 3
    stats = client.statistics().tenants
    assert stats["train"].rejections == 1 and stats["train"].served == 2
    assert stats["eval"].served == 1
