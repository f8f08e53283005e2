"""Tinker futures are the fleet's (docs/fleet.md, "Tinker futures"): submit on one
member, poll on another; resubmits dedupe fleet-wide; 404/410 keep their meaning."""

from __future__ import annotations

import functools
import itertools
import os
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from fleet_testing import open_members, sample_body, until_members
from gateway_harness import generation_requests, open_sim

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server" / "tinker"))
os.environ["TINKER_TELEMETRY"] = "0"

async def _session(client: httpx.AsyncClient) -> str:
    response = await client.post(
        "/api/v1/create_sampling_session",
        json={"session_id": "s", "sampling_session_seq_id": 0, "base_model": "sim-base"},
    )
    assert response.status_code == 200, response.text
    return str(response.json()["sampling_session_id"])


async def _two_members(
    engine_url: str, valkey: Any, fleet_name: str, stack: AsyncExitStack, **knobs: Any
) -> tuple[Any, Any, httpx.AsyncClient, httpx.AsyncClient, str]:
    """Two members on ``engine_url`` that see each other, an HTTP client for each,
    and a sampling session made through the first."""
    a, b = await open_members(engine_url, valkey, fleet_name, stack, **knobs)
    with trio.fail_after(30):
        await until_members([a, b], 2)
    ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
    cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
    return a, b, ca, cb, await _session(ca)


async def test_submit_on_one_member_poll_on_another_and_resubmit_anywhere(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        a, b, ca, cb, session = await _two_members(engine.url, valkey, fleet_name, stack)
        issued = (await ca.post("/api/v1/asample", json=sample_body(session, 1))).json()
        request_id = issued["request_id"]
        # A resubmit of the same (session, seq) on the other member: the same future.
        again = await cb.post("/api/v1/asample", json=sample_body(session, 1))
        assert again.status_code == 200 and again.json()["request_id"] == request_id
        on_b = await cb.post("/api/v1/retrieve_future", json={"request_id": request_id})
        assert on_b.status_code == 200, on_b.text
        on_a = await ca.post("/api/v1/retrieve_future", json={"request_id": request_id})
        assert on_a.status_code == 200
        assert on_b.content == on_a.content  # the same bytes on every re-poll, anywhere
        assert on_b.headers["content-type"] == on_a.headers["content-type"]
        assert generation_requests(engine) == 1  # never run twice for one (session, seq)
        # Never issued: 404 on any member.
        for client in (ca, cb):
            unknown = await client.post("/api/v1/retrieve_future", json={"request_id": "nope"})
            assert unknown.status_code == 404
        # Issued, result expired in the shared state: 410 (the SDK resubmits).
        import coredis

        async with coredis.Redis(unix_socket_path=str(valkey.socket)) as redis:
            assert await redis.delete([a.state.fleet.keys.result(request_id)]) == 1
        gone = await cb.post("/api/v1/retrieve_future", json={"request_id": request_id})
        assert gone.status_code == 410


async def test_pending_futures_of_a_member_that_left_answer_410(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(capacity=0, decode_ms_per_token=5000.0) as engine, AsyncExitStack() as stack:
        (b,) = await open_members(engine.url, valkey, fleet_name, stack, 1, future_hold=0.2)
        async with AsyncExitStack() as a_stack:
            (a,) = await open_members(engine.url, valkey, fleet_name, a_stack, 1, shutdown_grace=0.0)
            with trio.fail_after(30):
                await until_members([a, b], 2)
            async with httpx.AsyncClient(base_url=a.url, timeout=30) as ca:
                session = await _session(ca)
                pending = (await ca.post("/api/v1/asample", json=sample_body(session, 1))).json()
            async with httpx.AsyncClient(base_url=b.url, timeout=30) as cb:
                # Still pending on a live owner: B holds the poll, then 408.
                held = await cb.post(
                    "/api/v1/retrieve_future", json={"request_id": pending["request_id"]}
                )
                assert held.status_code == 408
        # A left the fleet with the sample pending: B answers 410 (the SDK resubmits).
        async with httpx.AsyncClient(base_url=b.url, timeout=30) as cb:
            with trio.fail_after(30):
                while len(b.state.fleet.members) != 1:
                    await b.state.fleet.wait_tick()
            gone = await cb.post("/api/v1/retrieve_future", json={"request_id": pending["request_id"]})
            assert gone.status_code == 410


async def test_a_poll_held_for_a_member_that_leaves_answers_410_then_not_after_the_hold(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    async with open_sim(capacity=0, decode_ms_per_token=5000.0) as engine, AsyncExitStack() as stack:
        # B holds a poll up to 10 minutes; the test gives it 30 s.
        (b,) = await open_members(engine.url, valkey, fleet_name, stack, 1, future_hold=600.0)
        answers: list[int] = []
        answered = trio.Event()
        async with httpx.AsyncClient(base_url=b.url, timeout=60) as cb, trio.open_nursery() as nursery:
            async with AsyncExitStack() as a_stack:
                (a,) = await open_members(engine.url, valkey, fleet_name, a_stack, 1, shutdown_grace=0.0)
                with trio.fail_after(30):
                    await until_members([a, b], 2)
                async with httpx.AsyncClient(base_url=a.url, timeout=30) as ca:
                    session = await _session(ca)
                    issued = await ca.post("/api/v1/asample", json=sample_body(session, 1))
                request_id = issued.json()["request_id"]

                async def poll() -> None:
                    held = await cb.post("/api/v1/retrieve_future", json={"request_id": request_id})
                    answers.append(held.status_code)
                    answered.set()

                nursery.start_soon(poll)
                waiting = b.state.fleet.futures._waiters
                with trio.fail_after(30):
                    while request_id not in waiting:  # B holds the poll
                        await b.state.fleet.wait_tick()
                assert answers == []
            # A left with the sample pending (and it crashed the same way: its
            # record expires): B ends the hold and answers 410.
            with trio.fail_after(30):
                await answered.wait()
        assert answers == [410]
        assert generation_requests(engine) == 1


class Balancer:
    """A tiny HTTP balancer (ASGI, forwarding with httpx): ``asample`` always goes to
    the first member, ``retrieve_future`` always to the second (so every poll lands
    on the member that did not issue the future), everything else in turn."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self._turn = itertools.cycle(range(len(urls)))
        self.hits: dict[tuple[str, int], int] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]  # startup / shutdown
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        index = {"/api/v1/asample": 0, "/api/v1/retrieve_future": 1}.get(scope["path"])
        if index is None:
            index = next(self._turn)
        self.hits[(scope["path"], index)] = self.hits.get((scope["path"], index), 0) + 1
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"host", b"content-length")]
        async with httpx.AsyncClient(base_url=self.urls[index], timeout=120) as client:
            response = await client.request(
                scope["method"], scope["path"], content=body, headers=headers,
                params=scope["query_string"].decode(),
            )
        await send({
            "type": "http.response.start",
            "status": response.status_code,
            "headers": [(k.encode(), v.encode()) for k, v in response.headers.items()
                        if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")],
        })
        await send({"type": "http.response.body", "body": response.content})


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    from _tinker_harness import serving as serve_app

    async with serve_app(app) as url:
        yield url


async def test_the_tinker_sdk_submits_on_one_member_and_polls_on_another(
    sdk_loop: None, valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    from _tinker_harness import sdk_sample

    async with open_sim(capacity=0, decode_ms_per_token=1.0) as engine, AsyncExitStack() as stack:
        members = await open_members(engine.url, valkey, fleet_name, stack)
        with trio.fail_after(30):
            await until_members(members, 2)
        balancer = Balancer([gw.url for gw in members])
        url = await stack.enter_async_context(serving(balancer))
        results: list[Any] = []

        async def one(seed: int) -> None:
            results.append(
                await trio.to_thread.run_sync(
                    functools.partial(
                        sdk_sample, url, base_model="sim-base", prompt=[1, 2, 3],
                        num_samples=2, max_tokens=6, seed=seed,
                    )
                )
            )

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for seed in range(8):
                    nursery.start_soon(one, seed)
        assert len(results) == 8 and all(len(r.sequences) == 2 for r in results)
        # Every sample ran once on the engine, and both members took submits and polls.
        assert generation_requests(engine) == 8
        assert balancer.hits[("/api/v1/asample", 0)] >= 8  # + SDK retries of a 503
        assert balancer.hits[("/api/v1/retrieve_future", 1)] >= 8
        assert ("/api/v1/retrieve_future", 0) not in balancer.hits


async def test_a_claim_that_outlived_its_request_is_run_not_left_dangling(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    """Redis ran this member's claim after the asample waiting for it gave up (503):
    the SDK's resubmit must get a future that runs, not an id nobody runs."""
    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        (a,) = await open_members(engine.url, valkey, fleet_name, stack, 1)
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        session = await _session(client)
        fleet = a.state.fleet
        dangling = f"tf-{fleet.epoch}-999"
        import coredis

        async with coredis.Redis(unix_socket_path=str(valkey.socket)) as redis:
            await redis.set(fleet.keys.dedupe(session, "5"), dangling)
        issued = await client.post("/api/v1/asample", json=sample_body(session, 5))
        assert issued.json()["request_id"] == dangling
        polled = await client.post("/api/v1/retrieve_future", json={"request_id": dangling})
        assert polled.status_code == 200, polled.text
        assert generation_requests(engine) == 1


async def _submit_on_a_resubmit_and_poll_on_both(
    ca: httpx.AsyncClient, cb: httpx.AsyncClient, session: str, seq: int
) -> None:
    """``(session, seq)`` submitted on A and again on B (the same future), then
    polled on both members: 200 and the same bytes."""
    issued = await ca.post("/api/v1/asample", json=sample_body(session, seq))
    assert issued.status_code == 200, issued.text
    request_id = issued.json()["request_id"]
    again = await cb.post("/api/v1/asample", json=sample_body(session, seq))
    assert again.status_code == 200 and again.json()["request_id"] == request_id
    on_b = await cb.post("/api/v1/retrieve_future", json={"request_id": request_id})
    assert on_b.status_code == 200, on_b.text
    on_a = await ca.post("/api/v1/retrieve_future", json={"request_id": request_id})
    assert on_a.content == on_b.content


async def test_claims_and_results_survive_a_server_that_forgot_the_scripts(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    # Claims and results go out as Lua script calls (EVALSHA). A restarted or
    # promoted server has no scripts loaded: the member loads them again
    # (NOSCRIPT) and the sample is claimed, run once and readable elsewhere.
    import hashlib

    import coredis

    from trioforward.fleet._futures import CLAIM_SCRIPT, WRITE_SCRIPT

    shas = [hashlib.sha1(script.encode()).hexdigest() for script in (CLAIM_SCRIPT, WRITE_SCRIPT)]
    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        a, b, ca, cb, session = await _two_members(engine.url, valkey, fleet_name, stack)
        first = (await ca.post("/api/v1/asample", json=sample_body(session, 1))).json()["request_id"]
        assert (await cb.post("/api/v1/retrieve_future", json={"request_id": first})).status_code == 200
        redis = await stack.enter_async_context(coredis.Redis(unix_socket_path=str(valkey.socket)))
        assert await redis.script_exists(shas) == (True, True)
        await redis.script_flush()
        assert await redis.script_exists(shas) == (False, False)
        await _submit_on_a_resubmit_and_poll_on_both(ca, cb, session, 2)
        assert generation_requests(engine) == 2  # each (session, seq) ran once
        assert await redis.script_exists(shas) == (True, True)  # loaded again


async def test_a_server_that_refuses_scripts_gets_pipelines_and_loses_nothing(
    valkey: Any, fleet_name: str, fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    # An ACL without @scripting (or a service that disabled EVAL) answers NOPERM:
    # the members send the same commands as pipelines and the futures stay the fleet's.
    import coredis

    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        redis = await stack.enter_async_context(coredis.Redis(unix_socket_path=str(valkey.socket)))
        assert await redis.acl_setuser("default", "-@scripting")
        a, b, ca, cb, session = await _two_members(engine.url, valkey, fleet_name, stack)
        await _submit_on_a_resubmit_and_poll_on_both(ca, cb, session, 1)
        assert generation_requests(engine) == 1  # claimed once fleet-wide, run once
        assert not a.state.fleet.futures.scripts and not b.state.fleet.futures.scripts
    refused = [r for r in caplog.records if "refused a script" in r.getMessage()]
    assert refused and all(r.levelname == "WARNING" for r in refused)


async def test_fleet_refusals_are_counted_in_tinker_rejections(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    """The refusals fleet mode answers inside the route's work, in
    ``trioforward_tinker_rejections_total`` (docs/server.md, "Metrics (`GET /metrics`)"):
    429 ``queue_full`` from the fleet-wide claim path, and 408 from a poll held
    for another member's future."""
    from prometheus_client.parser import text_string_to_metric_families

    def rejections(text: str) -> dict[tuple[str, str, str], float]:
        return {
            (s.labels["route"], s.labels["status"], s.labels["code"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "trioforward_tinker_rejections_total"
        }

    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        a, b, ca, cb, session = await _two_members(engine.url, valkey, fleet_name, stack, max_outstanding=1, future_hold=0.05)
        await a.state.client.pause()  # the first sample stays outstanding on A
        issued = await ca.post("/api/v1/asample", json=sample_body(session, 1))
        assert issued.status_code == 200
        full = await ca.post("/api/v1/asample", json=sample_body(session, 2))
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        request_id = issued.json()["request_id"]
        held = await cb.post("/api/v1/retrieve_future", json={"request_id": request_id})
        assert held.status_code == 408  # B waited for A's result past its hold
        on_a = rejections((await ca.get("/metrics")).text)
        on_b = rejections((await cb.get("/metrics")).text)
        await a.state.client.resume()
        with trio.fail_after(30):  # the sample ends before the members do
            while (await ca.post("/api/v1/retrieve_future", json={"request_id": request_id})).status_code == 408:
                pass
    assert on_a == {("/api/v1/asample", "429", "queue_full"): 1}
    assert on_b == {("/api/v1/retrieve_future", "408", "try_again"): 1}
