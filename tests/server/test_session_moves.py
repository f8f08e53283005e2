"""Sessions that move, over HTTP: a session pinned to an engine that queues moves
to one that does not, the move is on /metrics, /finish_session ends a session
(docs/dispatch.md, "Sessions that move")."""

from __future__ import annotations

import math

import httpx
import trio
from gateway_harness import generation_requests, open_gateway, open_sim

from trioforward.dispatch.engines._routing import rendezvous_score, stable_hash

BODY = {"model": "sim-base", "prompt": [1, 2, 3], "max_tokens": 2}


async def test_a_session_leaves_a_queueing_engine_and_the_move_is_counted(fd_baseline: int) -> None:
    async with open_sim(capacity=1) as a, open_sim(capacity=1) as b:
        # A session whose rendezvous home is a.
        session, filler = [
            s for s in (f"episode-{i}" for i in range(100))
            if rendezvous_score(stable_hash(s), stable_hash(a.url)) > rendezvous_score(stable_hash(s), stable_hash(b.url))
        ][:2]
        async with open_gateway(a.url, b.url, routing="session", load_interval=0.01, engine_kind="vllm") as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=None) as http:
                first = await http.post("/v1/completions", json=BODY, headers={"X-Session-ID": session})
                assert first.status_code == 200 and generation_requests(a) == 1
                # a runs one sequence of another session at home there and queues
                # three: it reports more waiting than its slack (2).
                a.prefill_stall(math.inf)
                async with trio.open_nursery() as nursery:
                    for _ in range(4):
                        nursery.start_soon(
                            lambda: http.post("/v1/completions", json=BODY, headers={"X-Session-ID": filler})
                        )
                    with trio.fail_after(30):  # a hang guard only
                        while not gw.state.client._registry.get(a.url).saturated:  # noqa: ASYNC110
                            await trio.sleep(0.01)  # reports arrive on their own clock
                    moved = await http.post("/v1/completions", json=BODY, headers={"X-Session-ID": session})
                    assert moved.status_code == 200
                    a.end_stall()
                assert generation_requests(b) >= 1
                assert gw.state.client.statistics().session_moves == 1
                metrics = (await http.get("/metrics")).text
                assert "trioforward_session_moves_total 1.0" in metrics
                # Its next turn stays where it went, though a is calm again.
                again = await http.post("/v1/completions", json=BODY, headers={"X-Session-ID": session})
                assert again.status_code == 200 and gw.state.client.statistics().session_moves == 1
                served_b = generation_requests(b)
                again = await http.post("/v1/completions", json=BODY, headers={"X-Session-ID": session})
                assert generation_requests(b) == served_b + 1
                # Ended: placed afresh (its home, a) next time.
                ended = await http.post(f"/finish_session?session_id={session}")
                assert ended.status_code == 200 and ended.json()["finished"] is True
                assert (await http.post("/finish_session", json={"session_id": session})).json()["finished"] is False
                served_a = generation_requests(a)
                await http.post("/v1/completions", json=BODY, headers={"X-Session-ID": session})
                assert generation_requests(a) == served_a + 1
                bad = await http.post("/finish_session")
                assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_session_id"
