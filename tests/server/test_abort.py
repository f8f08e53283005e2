"""POST /admin/abort through the gateway: by group, by id, all; streams; Tinker; engine-side counts."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import trio
import trio.testing
from gateway_harness import Gateway, generation_requests, open_gateway, open_sim

LONG = 4000  # tokens: a generation that only an abort ends within the test
SHORT = 60
# Group B runs beside A to its end: long enough to be running when A is aborted
# (its end frees capacity the queued A requests would take), short enough to wait for.
MEDIUM = 1200


def body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-base", "prompt": [1, 2, 3], "max_tokens": max_tokens, "return_token_ids": True, **extra}


async def engine_until(engine: Any, predicate: Any) -> None:
    """Wait for ``predicate(engine.stats)``, re-checked at each change of its counters."""
    with trio.fail_after(60):
        await engine.stats.wait_for(predicate)


class Seen:
    """Stream events read so far; :meth:`wait` returns once ``count`` were."""

    def __init__(self) -> None:
        self.count = 0
        self._more = trio.Event()

    def add(self) -> None:
        self.count += 1
        self._more.set()
        self._more = trio.Event()

    async def wait(self, count: int) -> None:
        with trio.fail_after(60):
            while self.count < count:
                await self._more.wait()


class Answers(dict[str, Any]):
    """The answers by key; :meth:`wait` returns once ``key``'s has come."""

    def __init__(self) -> None:
        super().__init__()
        self._more = trio.Event()

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._more.set()
        self._more = trio.Event()

    async def wait(self, key: str) -> None:
        with trio.fail_after(60):
            while key not in self:
                await self._more.wait()


async def post(
    http: httpx.AsyncClient, out: dict[str, Any], key: str, data: dict[str, Any], headers: dict[str, str]
) -> None:
    response = await http.post("/v1/completions", json=data, headers=headers)
    out[key] = response


async def read_stream(http: httpx.AsyncClient, out: dict[str, Any], headers: dict[str, str], seen: Seen) -> None:
    events: list[bytes] = []
    async with http.stream("POST", "/v1/completions", json=body(LONG, stream=True), headers=headers) as response:
        out["stream_status"] = response.status_code
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:].encode())
                seen.add()
    out["stream"] = events


async def test_abort_a_group_running_and_queued_leaves_other_groups_whole(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=5) as engine, open_gateway(
        engine.url, engine_capacity=12, abort_grace=30.0
    ) as gw:
        out: dict[str, Any] = {}
        seen = Seen()
        client = gw.state.client
        async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http, trio.open_nursery() as nursery:
            for i in range(7):
                nursery.start_soon(post, http, out, f"a{i}", body(LONG), {"X-Rollout-Group": "A", "X-Request-Id": f"a-{i}"})
            nursery.start_soon(read_stream, http, out, {"X-Rollout-Group": "A", "X-Request-Id": "a-s"}, seen)
            await seen.wait(3)
            await engine_until(engine, lambda s: s.running == 8)
            for i in range(3):
                nursery.start_soon(post, http, out, f"b{i}", body(MEDIUM), {"X-Rollout-Group": "B"})
            nursery.start_soon(post, http, out, "solo", body(MEDIUM), {"X-Request-Id": "solo-1"})
            await engine_until(engine, lambda s: s.running == 12)
            for i in range(4):
                nursery.start_soon(post, http, out, f"q{i}", body(LONG), {"X-Rollout-Group": "A", "X-Request-Id": f"a-q-{i}"})
            # They queue at the gateway (loopback, no timer on the way): once every
            # task is blocked, all four wait for capacity.
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 4
            answer = await http.post("/admin/abort", json={"group": "A"})
            assert answer.status_code == 200
            done = answer.json()
            assert done.pop("group_tail")["members"] == 12  # the abort ended the group
            assert done == {"queued": 4, "on_engine": 8, "finished": 0}
        # Group A: twelve normal answers, finish "abort"; the running ones with their tokens so far.
        for key in [f"a{i}" for i in range(7)] + [f"q{i}" for i in range(4)]:
            response = out[key]
            assert response.status_code == 200, response.text
            (choice,) = response.json()["choices"]
            assert choice["finish_reason"] == "abort"
            if key.startswith("a"):
                assert 0 < len(choice["token_ids"]) < LONG
            else:
                assert choice["token_ids"] == []
        assert out["stream_status"] == 200
        assert out["stream"][-1] == b"[DONE]"
        last = orjson.loads(out["stream"][-2])
        assert last["choices"][0]["finish_reason"] == "abort"
        # Group B and the request of its own: whole.
        for key in ["b0", "b1", "b2", "solo"]:
            (choice,) = out[key].json()["choices"]
            assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == MEDIUM
        # Engine side: the 8 running were aborted there, the 4 queued never arrived.
        assert engine.stats.pause_aborted == 8
        assert generation_requests(engine) == 12
        assert not any(s.startswith("a-q-") for s in engine.stats.request_ids)
        assert await gw.pool_active() == 0
        assert client.statistics().in_flight == 0 and client.statistics().queued == 0


async def test_abort_by_id_and_all_and_unknown_ones(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=5) as engine, open_gateway(engine.url, abort_grace=30.0) as gw:
        out = Answers()
        async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http, trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(post, http, out, f"r{i}", body(LONG), {"X-Request-Id": f"r-{i}"})
            await engine_until(engine, lambda s: s.running == 3)
            one = await http.post("/admin/abort", json={"request_ids": ["r-1", "nobody"]})
            assert one.json() == {"queued": 0, "on_engine": 1, "finished": 0}
            await out.wait("r1")
            assert out["r1"].json()["choices"][0]["finish_reason"] == "abort"
            assert "r0" not in out and "r2" not in out  # the others run on
            again = await http.post("/admin/abort", json={"request_ids": ["r-1"]})
            assert again.json() == {"queued": 0, "on_engine": 0, "finished": 1}
            unknown = await http.post("/admin/abort", json={"group": "no-such-group"})
            assert unknown.json() == {"queued": 0, "on_engine": 0, "finished": 0}
            rest = await http.post("/admin/abort", json={"all": True})
            assert rest.json() == {"queued": 0, "on_engine": 2, "finished": 0}
        assert all(out[k].json()["choices"][0]["finish_reason"] == "abort" for k in ("r0", "r2"))
        assert engine.stats.pause_aborted == 3
        assert await gw.pool_active() == 0


async def test_bad_abort_bodies_are_refused_naming_the_field(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        for data, param in [
            ({}, None),
            ({"all": "yes"}, "all"),
            ({"all": True, "group": "g"}, "all"),
            ({"group": "has space"}, "group"),
            ({"request_ids": "r-1"}, "request_ids"),
            ({"groups": "g"}, "groups"),
        ]:
            response = await http.post("/admin/abort", json=data)
            assert response.status_code == 400, data
            assert response.json()["error"].get("param") == param, data


async def test_abort_on_an_engine_without_an_abort_route_closes_and_answers(fd_baseline: int) -> None:
    # vLLM without dev mode: no /abort_requests. The connection is closed (the
    # engine aborts as its client leaves); the caller still gets a normal answer,
    # and a stream its abort tail after what it had.
    async with open_sim(decode_ms_per_token=5, kind="none") as engine, open_gateway(engine.url) as gw:
        out: dict[str, Any] = {}
        seen = Seen()
        async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http, trio.open_nursery() as nursery:
            nursery.start_soon(post, http, out, "whole", body(LONG), {"X-Rollout-Group": "G"})
            nursery.start_soon(read_stream, http, out, {"X-Rollout-Group": "G"}, seen)
            await seen.wait(3)
            await engine_until(engine, lambda s: s.running == 2)
            answer = await http.post("/admin/abort", json={"group": "G"})
            done = answer.json()
            assert done.pop("group_tail")["members"] == 2  # the abort ended the group
            assert done == {"queued": 0, "on_engine": 2, "finished": 0}
        (choice,) = out["whole"].json()["choices"]
        assert out["whole"].status_code == 200 and choice["finish_reason"] == "abort"
        events = out["stream"]
        assert events[-1] == b"[DONE]"
        assert orjson.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
        assert all(e == b"[DONE]" or orjson.loads(e) for e in events)  # every event whole
        await engine_until(engine, lambda s: s.aborted == 2)  # the engine saw its client leave
        assert await gw.pool_active() == 0


async def test_a_tinker_sample_in_an_aborted_group_gets_its_tokens_so_far(fd_baseline: int) -> None:
    from tinker.proto.response_conv import deserialize_sample_response

    async with open_sim(decode_ms_per_token=5) as engine, open_gateway(engine.url, abort_grace=30.0) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=None, headers={"X-Rollout-Group": "T"}) as http:
            r = await http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "x"})
            r = await http.post(
                "/api/v1/create_sampling_session",
                json={"session_id": r.json()["session_id"], "sampling_session_seq_id": 0, "base_model": "sim-base"},
            )
            session = r.json()["sampling_session_id"]
            sample = {
                "type": "sample",
                "num_samples": 2,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]},
                "sampling_params": {"max_tokens": LONG, "seed": 1, "temperature": 1.0},
                "sampling_session_id": session,
                "seq_id": 0,
            }
            future = (await http.post("/api/v1/asample", json=sample)).json()["request_id"]
            await engine_until(engine, lambda s: s.running == 1)
            answer = await http.post("/admin/abort", json={"group": "T"})
            done = answer.json()
            assert done.pop("group_tail")["members"] == 1  # the abort ended the group
            assert done == {"queued": 0, "on_engine": 1, "finished": 0}
            done = await http.post("/api/v1/retrieve_future", json={"request_id": future})
        assert done.status_code == 200
        sequences = deserialize_sample_response(done.content).sequences
        assert len(sequences) == 2
        for seq in sequences:
            assert seq.stop_reason == "length" and len(seq.tokens) < LONG
        assert engine.stats.pause_aborted == 1
