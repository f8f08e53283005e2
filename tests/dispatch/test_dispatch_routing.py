"""Routing against live engines: least-outstanding spreads, session is sticky (docs/dispatch.md, "Engines, capacity and routing")."""

from __future__ import annotations

import math
from collections import Counter

import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.dispatch.engines._routing import rendezvous_score, stable_hash
from trioforward.sim import open_engine


async def test_least_outstanding_spreads_concurrent_load(fd_baseline: int) -> None:
    async with (
        open_engine(decode_ms_per_token=20) as e1,
        open_engine(decode_ms_per_token=20) as e2,
        open_engine(decode_ms_per_token=20) as e3,
        client_for(e1, e2, e3) as client,
    ):
        async with trio.open_nursery() as nursery:
            for _ in range(30):
                nursery.start_soon(lambda: client.post(COMPLETION, json=body(max_tokens=5)))
        assert [completions(e) for e in (e1, e2, e3)] == [10, 10, 10]
        assert all(e.stats.peak_running == 10 for e in (e1, e2, e3))


async def test_least_outstanding_avoids_busy_engine(fd_baseline: int) -> None:
    async with (
        open_engine(decode_ms_per_token=1000) as slow,
        open_engine() as fast,
        client_for(slow, fast) as client,
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: client.post(COMPLETION, json=body(max_tokens=3)))
            await slow.stats.wait_for(lambda s: s.running == 1)
            # While the slow engine holds one request, every sequential request goes to the idle one.
            for _ in range(5):
                assert (await client.post(COMPLETION, json=body())).engine == fast.url
            nursery.cancel_scope.cancel()


async def test_session_routing_sticky_and_falls_back_when_paused(fd_baseline: int) -> None:
    async with (
        open_engine() as e1,
        open_engine() as e2,
        open_engine() as e3,
        client_for(e1, e2, e3, routing="session") as client,
    ):
        owners = Counter()
        for _ in range(10):
            owners[(await client.post(COMPLETION, json=body(), session="trainer-7")).engine] += 1
        assert len(owners) == 1
        owner = next(iter(owners))
        # Header form of the key routes the same way.
        r = await client.post(COMPLETION, json=body(), headers={"X-Session-ID": "trainer-7"})
        assert r.engine == owner
        await client.pause([owner])
        fallback = (await client.post(COMPLETION, json=body(), session="trainer-7")).engine
        assert fallback != owner
        assert (await client.post(COMPLETION, json=body(), session="trainer-7")).engine == fallback
        await client.resume([owner])
        assert (await client.post(COMPLETION, json=body(), session="trainer-7")).engine == owner
        # Many sessions spread over every engine.
        spread = {
            (await client.post(COMPLETION, json=body(), session=f"s{i}")).engine for i in range(40)
        }
        assert spread == {e1.url, e2.url, e3.url}


async def test_session_falls_back_when_engine_down(fd_baseline: int) -> None:
    async with open_engine() as e1, open_engine() as e2:
        async with client_for(e1, e2, routing="session", health_failures=1) as client:
            owner_url = (await client.post(COMPLETION, json=body(), session="abc")).engine
            owner, other = (e1, e2) if owner_url == e1.url else (e2, e1)
            await owner.stop_listening()
            client._pool.close_idle()
            r = await client.post(COMPLETION, json=body(), session="abc")
            assert r.engine == other.url and r.retries == (("connect", "connect_error"),)
            assert (await client.post(COMPLETION, json=body(), session="abc")).attempts == 1


async def test_round_robin(fd_baseline: int) -> None:
    async with (
        open_engine() as e1,
        open_engine() as e2,
        client_for(e1, e2, routing="round-robin") as client,
    ):
        seen = [(await client.post(COMPLETION, json=body())).engine for _ in range(4)]
        assert seen == [e1.url, e2.url, e1.url, e2.url]


async def test_engines_added_and_removed_at_run_time(fd_baseline: int) -> None:
    async with open_engine() as e1, open_engine() as e2, client_for(e1) as client:
        client.engines.add(e2.url)
        assert [i.url for i in client.engines.list()] == [e1.url, e2.url]
        assert client.engines.remove(e1.url)
        assert not client.engines.remove(e1.url)
        for _ in range(3):
            assert (await client.post(COMPLETION, json=body())).engine == e2.url
        assert completions(e1) == 0


async def test_prefix_routing_keeps_groups_and_turns_on_one_engine(fd_baseline: int) -> None:
    async with (
        open_engine(prefix_cache_tokens=1 << 16) as e1,
        open_engine(prefix_cache_tokens=1 << 16) as e2,
        open_engine(prefix_cache_tokens=1 << 16) as e3,
        client_for(e1, e2, e3, routing="prefix") as client,
    ):
        engines = (e1, e2, e3)
        # A GRPO group: the same prompt as separate requests, no header.
        group = list(range(100, 164))
        owners = {(await client.post(COMPLETION, json=body(prompt=group))).engine for _ in range(6)}
        assert len(owners) == 1
        assert sum(e.stats.prompt_tokens_cached for e in engines) == 5 * 48  # 3 blocks reused 5x
        # A multi-turn session: each prompt extends the last by the answer and new tokens.
        turn = list(range(2000, 2060))  # 300 bytes rendered: one routing block
        where = set()
        for t in range(4):
            r = await client.post(
                COMPLETION, json=body(prompt=turn, max_tokens=8, return_token_ids=True)
            )
            where.add(r.engine)
            usage = r.json()["usage"]
            if t:
                assert usage["prompt_tokens_details"]["cached_tokens"] >= len(turn) - 16 - 11
            answer = r.json()["choices"][0]["token_ids"]
            turn = [*turn, *answer, *range(t, t + 11)]
        assert len(where) == 1
        # Many distinct prompts spread over every engine.
        spread = {
            (await client.post(COMPLETION, json=body(prompt=[i] * 40))).engine for i in range(40)
        }
        assert spread == {e.url for e in engines}


async def test_prefix_routing_is_work_conserving(fd_baseline: int) -> None:
    # engine_capacity 1: one request runs per engine, the rest queue at the gateway.
    # prefix_tokens 16: prompts sharing 16 leading ids prefer the same engine.
    knobs = {"engine_capacity": 1, "prefix_load_factor": 4.0, "prefix_tokens": 16}
    async with (
        open_engine() as e1,
        open_engine() as e2,
        client_for(e1, e2, routing="prefix", **knobs) as client,
    ):
        by_url = {e1.url: e1, e2.url: e2}
        for e in by_url.values():
            e.prefill_stall(math.inf)  # decoding halts: requests stay in flight
        done: dict[str, str] = {}

        async def post(name: str, prompt: list[int]) -> None:
            done[name] = (await client.post(COMPLETION, json=body(prompt=prompt))).engine

        group = list(range(500, 564))
        async with trio.open_nursery() as nursery:
            # Another prompt with the group's anchor: it takes the group's engine.
            nursery.start_soon(post, "other", group[:16] + list(range(900, 948)))
            await trio.testing.wait_all_tasks_blocked()
            first = next(e for e in by_url.values() if e.stats.running == 1)
            # The group's first copy would queue behind "other" if that engine
            # were its choice: it takes the free slot of the other engine.
            nursery.start_soon(post, "copy 1", group)
            await trio.testing.wait_all_tasks_blocked()
            second = next(e for e in by_url.values() if e is not first)
            assert second.stats.running == 1
            # The second copy follows the first and queues: no slot is free.
            nursery.start_soon(post, "copy 2", group)
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 1
            # A slot frees on the first engine: it takes the queued copy at once,
            # while the first copy still runs on the second engine.
            first.end_stall()
            with trio.fail_after(10):  # a hang guard only; the assertion is the order
                await first.stats.wait_for(lambda s: s.by_path[COMPLETION] == 2 and s.running == 0)
            assert second.stats.running == 1 and completions(second) == 1
            second.end_stall()
        assert done == {"other": first.url, "copy 1": second.url, "copy 2": first.url}


async def test_a_turn_moved_by_work_conservation_takes_its_next_turn_along(
    fd_baseline: int,
) -> None:
    # engine_capacity 1: one request runs per engine, the rest queue at the gateway.
    knobs = {"engine_capacity": 1, "prefix_load_factor": 4.0, "prefix_tokens": 16}
    async with (
        open_engine(prefix_cache_tokens=1 << 16) as e1,
        open_engine(prefix_cache_tokens=1 << 16) as e2,
        client_for(e1, e2, routing="prefix", **knobs) as client,
    ):
        by_url = {e1.url: e1, e2.url: e2}
        turn1 = list(range(3000, 3120))  # 600 bytes rendered: two routing blocks
        home = by_url[(await client.post(COMPLETION, json=body(prompt=turn1))).engine]
        other = next(e for e in by_url.values() if e is not home)
        for e in by_url.values():
            e.prefill_stall(math.inf)  # decoding halts: requests stay in flight
        turn2 = [*turn1, *range(5000, 5100)]
        where: dict[str, str] = {}

        async def post(name: str, prompt: list[int]) -> None:
            where[name] = (await client.post(COMPLETION, json=body(prompt=prompt))).engine

        async with trio.open_nursery() as nursery:
            # The session's anchor with another tail: it takes the session's engine.
            nursery.start_soon(post, "blocker", turn1[:16] + list(range(7000, 7100)))
            await trio.testing.wait_all_tasks_blocked()
            assert home.stats.running == 1
            nursery.start_soon(post, "filler", list(range(8000, 8100)))  # the free slot
            await trio.testing.wait_all_tasks_blocked()
            assert other.stats.running == 1
            # The second turn follows the first to its engine and queues there.
            nursery.start_soon(post, "turn 2", turn2)
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 1
            # The other engine's slot frees first: it takes the queued turn.
            other.end_stall()
            with trio.fail_after(10):  # a hang guard only; the assertion is the order
                await other.stats.wait_for(lambda s: s.by_path[COMPLETION] == 2 and s.running == 0)
            home.end_stall()
        assert where["turn 2"] == other.url and where["blocker"] == home.url
        # The third turn extends the second: it goes where the second ran, and
        # finds all of the second's full blocks cached there.
        turn3 = [*turn2, *range(6000, 6100)]
        r = await client.post(COMPLETION, json=body(prompt=turn3))
        assert r.engine == other.url
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == len(turn2) // 16 * 16


async def test_work_conservation_leaves_session_requests_where_their_session_is(
    fd_baseline: int,
) -> None:
    async with (
        open_engine() as e1,
        open_engine() as e2,
        client_for(e1, e2, routing="prefix", engine_capacity=1, prefix_load_factor=4.0) as client,
    ):
        # A session key whose engine (rendezvous order) is e1.
        key = next(
            k
            for k in (f"conversation-{i}" for i in range(100))
            if rendezvous_score(stable_hash(k), stable_hash(e1.url))
            > rendezvous_score(stable_hash(k), stable_hash(e2.url))
        )
        for e in (e1, e2):
            e.prefill_stall(math.inf)

        async def post(prompt: list[int], session: str | None = None) -> None:
            await client.post(COMPLETION, json=body(prompt=prompt), session=session)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, list(range(100, 164)), key)  # runs on e1
            nursery.start_soon(post, list(range(200, 264)), key)  # queues for e1
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(post, list(range(300, 364)))  # the free slot: e2
            await trio.testing.wait_all_tasks_blocked()
            assert e1.stats.running == 1 and e2.stats.running == 1
            assert client.statistics().queued == 1
            e2.end_stall()  # e2's slot frees while a session request queues for e1
            await e2.stats.wait_for(lambda s: s.running == 0 and s.by_path[COMPLETION] == 1)
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 1 and completions(e2) == 1
            e1.end_stall()
        assert completions(e1) == 2 and completions(e2) == 1
