"""The prefix cache model: full blocks, hash chains, LRU, prefill charged for misses only."""

from __future__ import annotations

import pytest
import trio
from click.testing import CliRunner
from simclient import Conn, request

from trioforward.sim import PrefixCache, expected_tokens, open_engine
from trioforward.sim.engine._cli import sim_engine


def test_match_counts_whole_leading_blocks_and_never_the_last_token() -> None:
    cache = PrefixCache(1024, block_size=4)
    prompt = list(range(10))
    assert cache.match("m", prompt) == 0
    cache.insert("m", prompt)  # blocks [0..3], [4..7]; 8, 9 not a full block
    assert cache.blocks == 2
    assert cache.match("m", prompt) == 8
    assert cache.match("m", prompt[:8]) == 4  # the last token is always computed
    assert cache.match("m", prompt[:9]) == 8
    assert cache.match("m", [*prompt[:4], 99, *prompt[5:]]) == 4  # the chain breaks at block 2
    assert cache.match("other-model", prompt) == 0  # the adapter is part of the key
    assert cache.match("m", [99, *prompt[1:]]) == 0  # a block's key depends on its parents


def test_lru_evicts_chains_from_their_tails() -> None:
    cache = PrefixCache(16, block_size=4)  # 4 blocks
    a, b = list(range(100, 112)), list(range(200, 212))  # 3 blocks each
    cache.insert("m", a)
    cache.insert("m", b)  # 6 blocks > 4: a's two tail blocks go
    assert (cache.blocks, cache.evictions) == (4, 2)
    assert cache.match("m", [*a, 0]) == 4  # a's first block survived, its tail did not
    assert cache.match("m", [*b, 0]) == 12
    with pytest.raises(ValueError):
        PrefixCache(3, block_size=4)


async def test_second_turn_reuses_prompt_and_answer(fd_baseline: int) -> None:
    async with open_engine(prefix_cache_tokens=4096, block_size=4) as engine, await Conn.open(
        engine
    ) as conn:
        turn1 = list(range(1, 18))  # 17 tokens: 4 full blocks
        reply = await conn.request(
            "POST", "/v1/completions", {"prompt": turn1, "max_tokens": 8, "seed": 1}
        )
        usage = reply.json()["usage"]
        assert usage["prompt_tokens"] == 17 and usage.get("prompt_tokens_details") is None
        answer = expected_tokens("sim-base", turn1, 1, 0, 8)
        turn2 = [*turn1, *answer, 7, 7, 7]  # 28 tokens; prompt + answer = 25 cached as 6 blocks
        reply = await conn.request("POST", "/v1/completions", {"prompt": turn2, "max_tokens": 2})
        assert reply.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 24}
        s = engine.stats
        assert (s.prompt_tokens_cached, s.prompt_tokens_computed) == (24, 17 + 28 - 24)


async def test_text_and_chat_prompts_are_cached_by_their_token_ids(fd_baseline: int) -> None:
    async with open_engine(prefix_cache_tokens=4096) as engine:
        text = "x" * 40  # 40 byte-tokens: 2 full blocks of 16
        await request(engine, "POST", "/v1/completions", {"prompt": text, "max_tokens": 1})
        reply = await request(engine, "POST", "/v1/completions", {"prompt": text + "y", "max_tokens": 1})
        assert reply.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
        chat = {"messages": [{"role": "user", "content": "z" * 40}], "max_tokens": 1}
        await request(engine, "POST", "/v1/chat/completions", chat)
        reply = await request(engine, "POST", "/v1/chat/completions", chat)
        assert reply.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}  # 46 tokens


async def test_prefill_is_charged_for_computed_tokens_only(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine(
        prefix_cache_tokens=4096, prefill_ms_per_token=10, keep_alive=None
    ) as engine, await Conn.open(engine) as conn:
        prompt = list(range(65))  # 4 blocks of 16 + 1
        body = {"prompt": prompt, "max_tokens": 0}
        start = trio.current_time()
        await conn.request("POST", "/v1/completions", body)
        assert trio.current_time() - start == pytest.approx(0.65)
        start = trio.current_time()
        reply = await conn.request("POST", "/v1/completions", body)
        assert trio.current_time() - start == pytest.approx(0.01)  # 64 cached, 1 computed
        assert reply.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}


async def test_without_a_cache_everything_is_computed(fd_baseline: int) -> None:
    async with open_engine() as engine:
        body = {"prompt": list(range(40)), "max_tokens": 1, "n": 3}
        for _ in range(2):
            reply = await request(engine, "POST", "/v1/completions", body)
            assert reply.json()["usage"].get("prompt_tokens_details") is None  # null, as vLLM
        assert (engine.stats.prompt_tokens_cached, engine.stats.prompt_tokens_computed) == (0, 80)
        stats = (await request(engine, "GET", "/sim/stats")).json()
        assert stats["prompt_tokens_computed"] == 80


async def test_stream_usage_and_reset_prefix_cache(fd_baseline: int) -> None:
    async with open_engine(prefix_cache_tokens=4096) as engine:
        body = {
            "prompt": list(range(40)),
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        await request(engine, "POST", "/v1/completions", body)
        reply = await request(engine, "POST", "/v1/completions", body)
        assert b'"prompt_tokens_details":{"cached_tokens":32}' in reply.body
        assert (await request(engine, "POST", "/reset_prefix_cache")).status == 200
        reply = await request(engine, "POST", "/v1/completions", body)
        assert b"prompt_tokens_details" not in reply.body
        assert engine.stats.prompt_tokens_cached == 32


def test_cli_refuses_a_cache_smaller_than_a_block() -> None:
    result = CliRunner().invoke(
        sim_engine, ["--port", "0", "--prefix-cache-tokens", "8", "--block-size", "16"]
    )
    assert result.exit_code == 2 and "--prefix-cache-tokens" in result.output
