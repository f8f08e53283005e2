"""Shutdown drain: a request never dispatched gets 503 ``shutting_down`` with
``Retry-After`` before the gateway exits, not an empty reply (docs/server.md,
"Shutdown")."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from gateway_harness import Gateway, generation_requests, open_gateway, open_sim

from trioforward.server.app._serve import answer_margin

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 4}
GRACE = 10.0


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    # Jumps only when every task has been blocked for 20 ms of real time, so
    # loopback I/O always completes first; the engine's decoding costs no real time.
    return trio.testing.MockClock(autojump_threshold=0.02)


class Replies:
    """Each request's response (or transport error) by name, awaitable."""

    def __init__(self) -> None:
        self.got: dict[str, httpx.Response | httpx.HTTPError] = {}
        self.at: dict[str, float] = {}
        self._arrived = trio.Event()

    async def send(self, url: str, name: str, body: dict[str, Any]) -> None:
        async with httpx.AsyncClient(timeout=None) as client:
            try:
                reply: httpx.Response | httpx.HTTPError = await client.post(
                    url + "/v1/completions", json=body
                )
            except httpx.HTTPError as exc:
                reply = exc
        self.got[name], self.at[name] = reply, trio.current_time()
        self._arrived.set()
        self._arrived = trio.Event()

    async def wait(self, name: str) -> httpx.Response | httpx.HTTPError:
        while name not in self.got:
            await self._arrived.wait()
        return self.got[name]


async def _until_queued(gw: Gateway, count: int) -> None:
    with trio.fail_after(10):
        while gw.state.client.statistics().queued < count:
            await trio.testing.wait_all_tasks_blocked(0.01)
            await trio.lowlevel.checkpoint()


def _assert_shutting_down(reply: object) -> None:
    assert isinstance(reply, httpx.Response), f"no answer: {reply!r}"
    assert reply.status_code == 503, reply.text
    assert reply.headers["retry-after"] == "1"
    error = reply.json()["error"]
    assert (error["code"], error["type"], error["phase"]) == ("shutting_down", "ShuttingDown", "queued")
    assert error["attempts"] == 0 and error["engine"] is None
    assert "shutting down" in error["message"]


@pytest.mark.parametrize(("running_tokens", "queued_served"), [(1000, False), (20, True)])
async def test_a_request_queued_for_capacity_is_answered_just_before_the_grace_ends(
    running_tokens: int,
    queued_served: bool,
    autojump_clock: trio.testing.MockClock,
    fd_baseline: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One slot. The running request takes 50 s (1000 tokens x 50 ms), longer than
    # the grace: the queued one is answered 503 shutting_down answer_margin before
    # the grace ends, and never reaches the engine. When the running one takes 1 s
    # the queued one is dispatched within the grace and served: no work is lost.
    caplog.set_level("INFO", logger="trioforward.access")
    replies = Replies()
    async with open_sim(decode_ms_per_token=50) as engine:
        async with open_gateway(engine.url, engine_capacity=1, shutdown_grace=GRACE) as gw:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(replies.send, gw.url, "running", {**BODY, "max_tokens": running_tokens})
                with trio.fail_after(10):
                    await engine.stats.wait_for(lambda s: s.running == 1)
                nursery.start_soon(replies.send, gw.url, "queued", BODY)
                await _until_queued(gw, 1)
                client = gw.state.client
                drain_start = trio.current_time()
                gw.stop.set()  # SIGTERM
                with trio.fail_after(GRACE + 5):
                    queued = await replies.wait("queued")
                    running = await replies.wait("running")
            assert client.statistics().queued == 0
        if queued_served:
            assert isinstance(queued, httpx.Response) and queued.status_code == 200
            assert isinstance(running, httpx.Response) and running.status_code == 200
            assert generation_requests(engine) == 2
            assert (engine.stats.completed, engine.stats.aborted) == (2, 0)
        else:
            _assert_shutting_down(queued)
            ends = drain_start + GRACE
            assert replies.at["queued"] == pytest.approx(ends - answer_margin(GRACE), abs=0.05)
            # The dispatched one keeps its drain: cut at the end of the grace.
            assert isinstance(running, httpx.HTTPError)
            with trio.fail_after(5):
                await engine.stats.wait_for(lambda s: s.aborted == 1)
            assert generation_requests(engine) == 1  # the queued one never reached it
            lines = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
            assert any(
                line.startswith("POST /v1/completions 503 engine=- attempts=0 ")
                and "error=shutting_down" in line
                for line in lines
            ), lines
            # The one cut at the grace's end got no answer, and the log says so (444,
            # nginx's "no response"), not the 500 it was never sent.
            cut = [line for line in lines if f"engine={engine.url}" in line]
            assert len(cut) == 1 and cut[0].startswith("POST /v1/completions 444 "), lines
            assert "error=closed_at_shutdown" in cut[0]


@contextmanager
def _dead_engine() -> Iterator[str]:
    """A loopback port that refuses connections (bound, never listening)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_waiting_for_an_ejected_engine_is_answered_when_the_drain_starts(
    stream: bool, autojump_clock: trio.testing.MockClock, fd_baseline: int
) -> None:
    # The reported case: the only engine is down and ejected, a request waits for
    # it (up to unhealthy_timeout, 60 s) when SIGTERM comes. Nothing in the grace
    # can serve it: it is answered at once, not with an empty reply at the end.
    replies = Replies()
    with _dead_engine() as dead:
        async with open_gateway(dead, shutdown_grace=GRACE) as gw:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(replies.send, gw.url, "first", BODY)
                first = await replies.wait("first")
                assert isinstance(first, httpx.Response) and first.status_code == 502, first
                assert not gw.state.client.engines.list()[0].healthy
                nursery.start_soon(replies.send, gw.url, "queued", {**BODY, "stream": stream})
                await _until_queued(gw, 1)
                drain_start = trio.current_time()
                gw.stop.set()
                with trio.fail_after(GRACE):
                    queued = await replies.wait("queued")
        _assert_shutting_down(queued)
        assert replies.at["queued"] - drain_start < 1.0  # at once, not at the grace's end


async def test_a_queued_tinker_sample_is_dropped_by_the_drain_and_its_held_poll_answers_410(
    autojump_clock: trio.testing.MockClock, fd_baseline: int
) -> None:
    # A Tinker sample runs in the server's nursery, not in a connection: ended
    # while QUEUED, its future must not stay pending (the poll would end with the
    # connection: no answer) nor resolve to an error object (terminal in the SDK).
    # Its id answers 410, on which the SDK resubmits the sample (docs/tinker.md).
    with _dead_engine() as dead:
        async with open_gateway(dead, shutdown_grace=GRACE, future_hold=60.0) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http:
                first = await http.post("/v1/completions", json=BODY)
                assert first.status_code == 502  # the engine is ejected
                r = await http.post(
                    "/api/v1/create_sampling_session",
                    json={"session_id": "s", "sampling_session_seq_id": 0, "base_model": "sim-base"},
                )
                sample = {
                    "num_samples": 1,
                    "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                    "sampling_params": {"max_tokens": 4, "seed": 0},
                    "sampling_session_id": r.json()["sampling_session_id"],
                    "seq_id": 0,
                }
                rid = (await http.post("/api/v1/asample", json=sample)).json()["request_id"]
                await _until_queued(gw, 1)
                polls: list[httpx.Response] = []

                async def poll() -> None:
                    polls.append(await http.post("/api/v1/retrieve_future", json={"request_id": rid}))

                store = gw.state.extras["tinker"].store
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(poll)
                    await trio.testing.wait_all_tasks_blocked(0.01)
                    drain_start = trio.current_time()
                    gw.stop.set()
                assert not store.holds(rid) and store.outstanding == 0
        assert [p.status_code for p in polls] == [410], [p.text for p in polls]
        assert polls[0].json()["error"]["code"] == "gone"
        assert trio.current_time() - drain_start < 1.0


async def test_held_polls_of_a_running_and_a_queued_tinker_sample_are_answered_before_the_grace_ends(
    autojump_clock: trio.testing.MockClock, fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    # One slot: one sample runs (longer than the grace), the other waits in the
    # Tinker layer's own queue (beyond the engines' capacity, never in the
    # dispatch queue). Both polls are held when SIGTERM comes. Each gets an answer
    # answer_margin before the grace ends, not a closed connection: the queued
    # one 410 (never ran: the SDK resubmits it), the running one 503
    # shutting_down with Retry-After (the SDK polls again; elsewhere, or here once
    # back, the id answers 410).
    caplog.set_level("INFO", logger="trioforward")
    async with open_sim(decode_ms_per_token=50) as engine:
        async with open_gateway(
            engine.url, engine_capacity=1, shutdown_grace=GRACE, future_hold=60.0
        ) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http:
                r = await http.post(
                    "/api/v1/create_sampling_session",
                    json={"session_id": "s", "sampling_session_seq_id": 0, "base_model": "sim-base"},
                )
                session = r.json()["sampling_session_id"]
                ids = []
                for seq in range(2):
                    sample = {
                        "num_samples": 1,
                        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                        "sampling_params": {"max_tokens": 1000, "seed": seq},
                        "sampling_session_id": session,
                        "seq_id": seq,
                    }
                    ids.append((await http.post("/api/v1/asample", json=sample)).json()["request_id"])
                with trio.fail_after(10):
                    await engine.stats.wait_for(lambda s: s.running == 1)
                tinker = gw.state.extras["tinker"]
                assert tinker.runner.queued == 1  # the second waits in the Tinker layer
                polls: dict[str, httpx.Response | httpx.HTTPError] = {}

                async def poll(name: str, rid: str) -> None:
                    try:
                        polls[name] = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
                    except httpx.HTTPError as exc:
                        polls[name] = exc

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(poll, "running", ids[0])
                    nursery.start_soon(poll, "queued", ids[1])
                    await trio.testing.wait_all_tasks_blocked(0.01)
                    drain_start = trio.current_time()
                    gw.stop.set()
                answered_at = trio.current_time()
        assert generation_requests(engine) == 1  # the queued sample never reached it
    queued, running = polls["queued"], polls["running"]
    assert isinstance(queued, httpx.Response), f"no answer: {queued!r}"
    assert queued.status_code == 410 and queued.json()["error"]["code"] == "gone"
    assert isinstance(running, httpx.Response), f"no answer: {running!r}"
    assert running.status_code == 503, running.text
    assert running.headers["retry-after"] == "1"
    assert running.json()["error"]["code"] == "shutting_down"
    # The connection closes after it (the drain reuses none): the answer says so,
    # or a client reusing it meets a close with no answer.
    assert running.headers["connection"] == "close" and queued.headers["connection"] == "close"
    assert answered_at - drain_start <= GRACE - answer_margin(GRACE) + 0.05
    # Nothing is logged as answered that was not: no 500 for a reply never sent.
    lines = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
    assert not any(" 500 " in line for line in lines), lines
