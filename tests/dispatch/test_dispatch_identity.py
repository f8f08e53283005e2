"""Request ids in the embedded client: given or made, sent fresh per attempt, exposed on answers."""

from __future__ import annotations

import pytest
from dispatch_testing import body, client_for, completions

from trioforward.errors import EngineConnectError
from trioforward.sim import open_engine


async def test_complete_takes_and_exposes_a_request_id(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        c = await client.complete(model="sim-base", prompt=[1, 2], max_tokens=2, request_id="q-1")
        assert c.request_id == "q-1"
        (seen,) = engine.stats.request_ids
        assert seen.startswith("q-1.") and c.id == f"cmpl-{seen}"


async def test_post_makes_an_id_when_none_is_given_and_reads_the_header(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        made = await client.post("/v1/completions", json=body())
        from_header = await client.post(
            "/v1/completions", json=body(), headers={"X-Request-Id": "hdr-9"}
        )
        async with client.stream("/v1/completions", json=body(stream=True)) as fs:
            await fs.aread()
        assert made.request_id and from_header.request_id == "hdr-9"
        assert fs.request_id and fs.request_id != made.request_id
        assert completions(engine) == 3
        sent = list(engine.stats.request_ids)
        assert [s.rpartition(".")[0] for s in sent] == [made.request_id, "hdr-9", fs.request_id]
        assert len(set(sent)) == 3


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "\u00e9t\u00e9"])
async def test_a_bad_request_id_or_group_is_a_value_error(fd_baseline: int, bad: str) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        with pytest.raises(ValueError, match="request_id"):
            await client.post("/v1/completions", json=body(), request_id=bad)
        with pytest.raises(ValueError, match="group"):
            await client.post("/v1/completions", json=body(), group=bad)
        assert completions(engine) == 0


async def test_a_dispatch_error_names_the_request_id(fd_baseline: int) -> None:
    async with client_for("http://127.0.0.1:9", connect_retries=0) as client:
        with pytest.raises(EngineConnectError) as info:
            await client.post("/v1/completions", json=body(), request_id="lost-1")
        assert info.value.request_id == "lost-1"


async def test_sglang_openai_routes_get_the_engine_side_id_as_the_body_rid(fd_baseline: int) -> None:
    # SGLang's /v1 routes ignore X-Request-Id: the id goes as the body's "rid"
    # (last, over the caller's own), which SGLang answers as the completion's id.
    async with open_engine(kind="sglang") as engine, client_for(engine) as client:
        await client.engines.wait_kind(engine.url)
        plain = await client.post("/v1/completions", json=body(rid="mine"), request_id="s-1")
        chat = await client.post(
            "/v1/chat/completions",
            json={"model": "sim-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            request_id="s-2",
        )
        first, second = engine.stats.request_ids
        assert first.startswith("s-1.") and second.startswith("s-2.")
        assert plain.json()["id"] == first and chat.json()["id"] == second
        assert engine.stats.by_path["/v1/completions"] == engine.stats.by_path["/v1/chat/completions"] == 1
