"""The sample runner: bounded workers in the server nursery, outcomes encoded once."""

from __future__ import annotations

import orjson
import trio
import trio.testing
from _tinker_harness import PostOnly, ScriptedClient
from tinker.proto.response_conv import deserialize_sample_response

from trioforward._settings import Settings
from trioforward.errors import DispatchTimeout
from trioforward.server.tinker._futures import READY, FutureStore
from trioforward.server.tinker._requests import make_sampling_session, parse_sample
from trioforward.server.tinker._runner import SampleRunner, run_sample
from trioforward.sim import sample

SAMPLING_SESSION = make_sampling_session("sess", 0, "sim-base", None, "/a", {})


def job(seq: int) -> object:
    body = {
        "num_samples": 2,
        "prompt": {"chunks": [{"tokens": [1, 2, seq]}]},
        "sampling_params": {"max_tokens": 5, "seed": seq},
        "seq_id": seq,
    }
    return parse_sample(body, SAMPLING_SESSION)


async def test_at_most_limit_workers_and_fifo_completion() -> None:
    client = ScriptedClient(Settings())
    client.gate = trio.Event()
    store = FutureStore()
    async with trio.open_nursery() as nursery:
        runner = SampleRunner(store, client, nursery, lambda: 2)
        futures = []
        for seq in range(5):
            future, _ = store.submit(("s", seq), 2)
            runner.submit(future, job(seq))  # type: ignore[arg-type]
            futures.append(future)
        await trio.testing.wait_all_tasks_blocked()
        assert runner.workers == 2 and runner.queued == 3
        assert len(client.requests) == 2
        client.gate.set()
    assert runner.workers == 0 and runner.completed_total == 5
    assert [r["prompt"][-1] for r in client.requests] == [0, 1, 2, 3, 4]
    for seq, future in enumerate(futures):
        assert future.state == READY
        response = deserialize_sample_response(future.body)
        assert [s.tokens for s in response.sequences] == [
            sample("sim-base", [1, 2, seq], seq, i, 5).tokens for i in range(2)
        ]


class _TimingOut(PostOnly):
    async def post(self, *args: object, **kwargs: object) -> object:
        raise DispatchTimeout("dispatch deadline passed")


async def test_gateway_failures_are_server_errors() -> None:
    body, content_type, _ = await run_sample(_TimingOut(), job(0))  # type: ignore[arg-type]
    assert content_type == "application/json"
    doc = orjson.loads(body)
    assert doc["category"] == "server" and "DispatchTimeout" in doc["error"]


class _TextOnly(PostOnly):
    """An engine that ignores ``return_token_ids``: a 200 answer with text only."""

    async def post(self, *args: object, **kwargs: object) -> object:
        choices = [{"index": i, "text": "hi", "finish_reason": "stop"} for i in range(2)]
        content = orjson.dumps({"id": "x", "choices": choices})
        return type("Answer", (), {"status": 200, "content": content, "weight_version": None})()


async def test_an_answer_without_token_ids_fails_the_sample_rather_than_sending_no_tokens() -> None:
    body, content_type, _ = await run_sample(_TextOnly(), job(0))  # type: ignore[arg-type]
    assert content_type == "application/json"  # an error, not a sample response
    doc = orjson.loads(body)
    assert doc["category"] == "server" and "without 'token_ids'" in doc["error"], doc
