"""A response that has started ends well-formed, whatever happens next.

After the 200 head of a stream went out, every way the stream can fail — pause
``mode="abort"``, the engine removed, the engine closing mid-event, the dispatch
deadline, ``read_timeout`` — ends the body with exactly one SSE error event on an
event boundary (a half-sent event is dropped) and a clean end of the chunked
body: no ``[DONE]``, no second response start. The access log and metrics record
what the client got: 200 plus the error code. A whole (non-streamed) response
cannot fail after its head: its head goes out only with the complete body.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import trio
from gateway_harness import generation_requests, open_gateway, open_sim

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 40}


async def _pause_abort(client: httpx.AsyncClient, engine: Any) -> None:
    assert (await client.post("/admin/pause", json={"mode": "abort"})).status_code == 200
    assert (await client.post("/admin/resume", json={})).status_code == 200


async def _remove_engine(client: httpx.AsyncClient, engine: Any) -> None:
    removed = await client.request("DELETE", "/admin/engines", json={"url": engine.url})
    assert removed.status_code == 200


@dataclass
class Ending:
    name: str
    code: str
    knobs: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    # Called once the first event has reached the client.
    action: Callable[[httpx.AsyncClient, Any], Awaitable[None]] | None = None


ENDINGS = [
    Ending("pause abort", "aborted", action=_pause_abort),
    Ending("engine removed", "aborted", action=_remove_engine),
    Ending("engine closes mid-event", "upstream_broken", faults={"cut": 1, "cut_bytes": 60}),
    Ending("read_timeout", "dispatch_timeout", knobs={"read_timeout": 0.3},
           faults={"stall_body": 1, "stall_seconds": 30.0}),
    Ending("dispatch deadline", "dispatch_timeout", knobs={"dispatch_timeout": 1.0},
           faults={"stall_body": 1, "stall_seconds": 30.0}),
]


def _events(raw: bytes) -> list[bytes]:
    """The SSE events of ``raw``; each must be one complete ``data:`` line."""
    assert raw.endswith(b"\n\n"), raw[-80:]
    events = raw[:-2].split(b"\n\n")
    for event in events:
        assert event.startswith(b"data: ") and b"\n" not in event, event
    return [e[len(b"data: ") :] for e in events]


@pytest.mark.parametrize("stock_hypercorn", [False, True], ids=["serve", "hypercorn"])
@pytest.mark.parametrize("ending", ENDINGS, ids=[e.name for e in ENDINGS])
async def test_a_started_stream_ends_with_one_error_event(
    ending: Ending, stock_hypercorn: bool, fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    async with open_sim(decode_ms_per_token=50) as engine, open_gateway(
        engine.url, stock_hypercorn=stock_hypercorn, **ending.knobs
    ) as gw:
        engine.faults.update(ending.faults)
        async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
            with trio.fail_after(20):
                async with client.stream(
                    "POST", "/v1/completions", json={**BODY, "stream": True}
                ) as response:
                    assert response.status_code == 200
                    raw = b""
                    # httpx raises RemoteProtocolError for a chunked body cut short.
                    async for chunk in response.aiter_raw():
                        if not raw and ending.action is not None:
                            await ending.action(client, engine)
                        raw += chunk
            metrics = (await client.get("/metrics")).text
        assert await gw.pool_active() == 0
        events = _events(raw)
        assert b"[DONE]" not in events
        for event in events[:-1]:
            assert "choices" in orjson.loads(event)  # every engine event whole
        # The engine's first event got through whole (a stall cuts into the first).
        assert len(events) >= (1 if "stall_body" in ending.faults else 2)
        error = orjson.loads(events[-1])["error"]
        assert error["code"] == ending.code and error["phase"] == "read_body"
        assert error["attempts"] == 1 and error["engine"] == engine.url
        assert generation_requests(engine) == 1  # never retried
    assert (
        f'trioforward_stream_errors_total{{code="{ending.code}",route="/v1/completions"}} 1.0'
        in metrics
    )
    assert 'trioforward_gateway_requests_total{route="/v1/completions",status="200"} 1.0' in metrics
    access = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
    assert len(access) == 1
    assert access[0].startswith("POST /v1/completions 200 ")
    assert access[0].endswith(f"error={ending.code}")
    # Nothing went wrong at the server level (no second response start, no app error).
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize(
    ("faults", "action", "status", "code", "phase"),
    [
        ({"cut": 1, "cut_bytes": 60}, None, 502, "upstream_broken", "read_body"),
        ({}, _pause_abort, 503, "aborted", "await_headers"),
    ],
    ids=["engine closes mid-body", "pause abort"],
)
async def test_a_whole_response_cannot_fail_after_its_head(
    faults: dict[str, Any], action: Any, status: int, code: str, phase: str, fd_baseline: int
) -> None:
    # By construction: the head goes out with the complete body, so a failure at any
    # point is still a clean error response with its own status.
    async with open_sim(decode_ms_per_token=50) as engine, open_gateway(engine.url) as gw:
        engine.faults.update(faults)
        async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    responses: list[httpx.Response] = []

                    async def call() -> None:
                        responses.append(await client.post("/v1/completions", json=BODY))

                    nursery.start_soon(call)
                    if action is not None:
                        await engine.stats.wait_for(lambda s: s.running == 1)
                        await action(client, engine)
        [response] = responses
        assert response.status_code == status
        error = response.json()["error"]
        assert error["code"] == code and error["phase"] == phase
        assert await gw.pool_active() == 0
