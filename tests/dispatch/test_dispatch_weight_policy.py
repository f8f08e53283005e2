"""Which weights a request accepts: ``latest``, ``min_version=V``, ``max_staleness=k``
during a rolling update, asserted from the engines' side; the answer's staleness."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.dispatch import ForwardResponse, parse_policy
from trioforward.errors import NoEngineAvailable
from trioforward.sim import SimEngine, open_engine


async def rolling_update(client: Any, updated: list[SimEngine]) -> None:
    """Every engine on v1, then ``updated`` (only) paused, pushed and resumed on v2."""
    await client.resume(weight_version="v1")
    urls = [e.url for e in updated]
    await client.pause(urls, engine_mode="abort")
    await client.resume(urls, weight_version="v2")


async def burst(client: Any, count: int, **kw: Any) -> list[ForwardResponse]:
    answers: list[ForwardResponse] = []

    async def one() -> None:
        answers.append(await client.post(COMPLETION, json=body(max_tokens=2), **kw))

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return answers


async def test_latest_reaches_only_updated_engines_and_max_staleness_1_uses_both(
    fd_baseline: int,
) -> None:
    async with open_engine() as a, open_engine() as b, open_engine() as c, open_engine() as d, client_for(
        a, b, c, d
    ) as client:
        fleet = (a, b, c, d)
        await rolling_update(client, [a, b])
        before = [completions(e) for e in fleet]
        answers = await burst(client, 32, weight_policy="latest")
        got = [completions(e) - n for e, n in zip(fleet, before, strict=True)]
        assert got[2] == got[3] == 0 and got[0] + got[1] == 32, got
        assert {r.engine for r in answers} <= {a.url, b.url}
        assert {(r.weight_version, r.staleness) for r in answers} == {("v2", 0)}

        before = [completions(e) for e in fleet]
        answers = await burst(client, 32, headers={"X-Weight-Policy": "max_staleness=1"})
        got = [completions(e) - n for e, n in zip(fleet, before, strict=True)]
        assert sum(got) == 32 and all(n > 0 for n in got), got  # old and new engines
        by_engine = {r.engine: (r.weight_version, r.staleness) for r in answers}
        assert by_engine[c.url] == by_engine[d.url] == ("v1", 1)
        assert by_engine[a.url] == by_engine[b.url] == ("v2", 0)

        # min_version=v2 is latest here; max_staleness=0 too.
        for policy in ("min_version=v2", "max_staleness=0"):
            before = [completions(e) for e in fleet]
            await burst(client, 8, weight_policy=policy)
            assert completions(c) == before[2] and completions(d) == before[3]


async def test_latest_waits_queued_for_an_updated_engine_then_runs_there(fd_baseline: int) -> None:
    async with open_engine() as a, open_engine() as b, client_for(a, b) as client:
        await rolling_update(client, [a])
        await client.pause([a.url])  # the only v2 engine is busy with something else
        answers: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _post_into(client, answers, weight_policy="latest"))
            await trio.testing.wait_all_tasks_blocked()
            assert answers == [] and completions(a) == 0 and completions(b) == 0
            assert client.statistics().queued == 1  # queued, not refused
            await client.resume([a.url])
        (answer,) = answers
        assert answer.engine == a.url and completions(a) == 1 and completions(b) == 0


async def _post_into(client: Any, into: list[ForwardResponse], **kw: Any) -> None:
    into.append(await client.post(COMPLETION, json=body(max_tokens=2), **kw))


async def test_a_version_not_resumed_yet_waits_until_queue_timeout(fd_baseline: int) -> None:
    async with open_engine() as a, client_for(a, queue_timeout=0.2) as client:
        await client.resume(weight_version="v1")
        with pytest.raises(NoEngineAvailable, match="X-Weight-Policy"):
            await client.post(COMPLETION, json=body(), weight_policy="min_version=v9")
        assert completions(a) == 0
        # The one engine runs the current version (v1): latest and max_staleness=0 are met.
        answer = await client.post(COMPLETION, json=body(), weight_policy="latest")
        assert answer.status == 200 and answer.staleness == 0
        completion = await client.complete(
            model="sim-base", prompt=[1, 2], max_tokens=2, weight_policy="max_staleness=0"
        )
        assert completion.staleness == 0 and completion.engine == a.url


@pytest.mark.parametrize(
    "text", ["", "newest", "latest=1", "max_staleness=-1", "max_staleness=x", "min_version=a,b"]
)
def test_a_malformed_policy_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="weight policy"):
        parse_policy(text)


def test_policies_read_back() -> None:
    assert str(parse_policy(" max_staleness = 2 ")) == "max_staleness=2"
    assert str(parse_policy("min_version=step-7")) == "min_version=step-7"
    assert str(parse_policy("latest")) == "latest"


async def test_a_resume_of_every_engine_does_not_release_one_held_for_its_report(
    fd_baseline: int,
) -> None:
    async with open_engine() as first, open_engine() as second, client_for(first) as client:
        await client.resume(weight_version="v1")
        client.engines.add(second.url)  # held out until it reports v1
        await client.resume(weight_version="v2")  # told nothing: it may still run anything
        engine = client._registry.get(second.url)
        assert engine.held_out is not None and engine.reported_version != "v2"
        assert client._registry.get(first.url).reported_version == "v2"
        answers = await burst(client, 4, weight_policy="max_staleness=5")
        assert {r.engine for r in answers} == {first.url} and completions(second) == 0
