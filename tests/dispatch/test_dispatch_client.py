"""The embedded client's API: complete(), stream(), headers, statistics."""

from __future__ import annotations

from functools import partial

import numpy as np
import orjson
import pytest
import trio
from dispatch_testing import COMPLETION, FAST, body, client_for, completions

from trioforward import SettingsError, open_client
from trioforward.codec import CodecError
from trioforward.errors import DispatchTimeout, EngineConnectError, EngineRejected
from trioforward.http import Phase
from trioforward.sim import expected_completion, expected_prompt_logprobs, open_engine


async def test_complete_decodes_tokens_and_logprobs(fd_baseline: int) -> None:
    prompt = [5, 6, 7, 8]
    async with open_engine() as engine, client_for(engine) as client:
        c = await client.complete(
            model="sim-base", prompt=prompt, max_tokens=6, n=2, seed=3, prompt_logprobs=0
        )
        assert c.engine == engine.url and c.attempts == 1 and c.model == "sim-base"
        assert len(c.choices) == 2
        for choice in c.choices:
            tokens, logprobs, finish = expected_completion("sim-base", prompt, 3, choice.index, 6)
            assert choice.tokens.dtype == np.int32 and choice.tokens.tolist() == tokens
            assert choice.logprobs is not None and choice.logprobs.dtype == np.float32
            np.testing.assert_allclose(choice.logprobs, np.array(logprobs, dtype=np.float32))
            assert choice.finish_reason == finish
        assert c.prompt_logprobs is not None and c.prompt_logprobs.dtype == np.float32
        assert c.prompt_logprobs.shape == (4,) and np.isnan(c.prompt_logprobs[0])
        want = [
            e[str(t)]["logprob"]
            for e, t in zip(
                expected_prompt_logprobs("sim-base", prompt)[1:], prompt[1:], strict=True
            )
        ]
        np.testing.assert_allclose(c.prompt_logprobs[1:], np.array(want, dtype=np.float32))
        assert c.usage["completion_tokens"] == 12


async def test_complete_without_logprobs_and_numpy_prompt(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        c = await client.complete(
            model="sim-base", prompt=np.array([1, 2], dtype=np.int32), max_tokens=3, logprobs=False
        )
        assert c.choices[0].logprobs is None and c.prompt_logprobs is None
        assert (
            c.choices[0].tokens.tolist() == expected_completion("sim-base", [1, 2], None, 0, 3)[0]
        )


async def test_complete_raises_engine_rejected(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        with pytest.raises(EngineRejected) as info:
            await client.complete(model="nope", prompt=[1], max_tokens=2)
        err = info.value
        assert err.status == 404 and b"does not exist" in err.body and err.attempts == 1
        assert err.engine == engine.url


async def test_post_with_raw_content_and_headers(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        raw = orjson.dumps(body())
        r = await client.post(
            COMPLETION,
            content=raw,
            headers=[
                ("Content-Type", "application/json"),
                ("Connection", "close"),
                ("Host", "evil"),
                ("X-Trace", "1"),
            ],
        )
        assert r.status == 200 and r.json()["model"] == "sim-base"
        names = {name for name, _ in r.headers}
        assert b"content-type" in names
        assert not names & {b"content-length", b"connection", b"keep-alive", b"transfer-encoding"}
        # "Connection: close" from the caller was not forwarded: the connection stays reusable.
        assert (await client.post(COMPLETION, json=body())).status == 200
        assert client.statistics().pool.opened_total == 1


async def test_get_request(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        r = await client.request("GET", "/v1/models")
        assert r.status == 200 and r.json()["object"] == "list"
        with pytest.raises(ValueError):
            await client.request("GET", "v1/models")


async def test_stream_relays_sse(fd_baseline: int) -> None:
    async with open_engine(decode_ms_per_token=1) as engine, client_for(engine) as client:
        async with client.stream(COMPLETION, json=body(max_tokens=5, stream=True)) as fs:
            assert fs.status == 200 and fs.engine == engine.url and fs.attempts == 1
            data = b"".join([chunk async for chunk in fs.aiter_bytes()])
        events = [line for line in data.split(b"\n\n") if line]
        assert events[-1] == b"data: [DONE]" and len(events) == 6
        assert engine.stats.completed == 1


async def test_stream_holds_capacity_and_connection_until_the_block_exits(
    fd_baseline: int,
) -> None:
    async with open_engine(decode_ms_per_token=1) as engine, client_for(engine) as client:
        async with client.stream(COMPLETION, json=body(max_tokens=5, stream=True)) as fs:
            await fs.aread()  # the body is complete, the block has not exited yet
            stats = client.statistics()
            assert stats.in_flight == 1 and stats.pool.active == 1 and stats.pool.idle == 0
            assert fs.engine_time > 0
        stats = client.statistics()
        assert stats.in_flight == 0 and stats.pool.active == 0 and stats.pool.idle == 1
        (info,) = client.engines.list()
        assert info.in_flight == 0


async def test_an_exception_in_the_stream_block_releases_capacity_and_closes_upstream(
    fd_baseline: int,
) -> None:
    async with open_engine(decode_ms_per_token=1) as engine, client_for(engine) as client:
        with pytest.raises(RuntimeError):
            async with client.stream(COMPLETION, json=body(max_tokens=5, stream=True)):
                raise RuntimeError("caller gave up")
        stats = client.statistics()
        assert stats.in_flight == 0 and stats.pool.active == 0
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted == 1)


async def test_stream_retries_before_headers(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        engine.faults.reject = 1
        async with client.stream(COMPLETION, json=body(stream=True)) as fs:
            assert fs.status == 200 and fs.attempts == 2
            assert fs.retries == (("await_headers", "rejection_503"),)
            assert (await fs.aread()).endswith(b"data: [DONE]\n\n")


async def test_stream_error_status_body_is_relayed(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        async with client.stream(COMPLETION, json=body(model="nope", stream=True)) as fs:
            assert fs.status == 404
            assert b"does not exist" in await fs.aread()
        assert completions(engine) == 1


async def test_stream_broken_mid_body_raises_read_body(fd_baseline: int) -> None:
    async with (
        open_engine(decode_ms_per_token=1) as engine,
        client_for(engine, read_timeout=0.2) as client,
    ):
        engine.faults.stall_body = 1
        with pytest.raises(DispatchTimeout) as info:
            async with client.stream(COMPLETION, json=body(max_tokens=5, stream=True)) as fs:
                async for _ in fs.aiter_bytes():
                    pass
        assert info.value.phase is Phase.READ_BODY and "read_timeout" in str(info.value)
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted == 1)
        assert completions(engine) == 1


async def test_leaving_stream_early_closes_upstream(fd_baseline: int) -> None:
    async with open_engine(decode_ms_per_token=50) as engine, client_for(engine) as client:
        async with client.stream(COMPLETION, json=body(max_tokens=40, stream=True)) as fs:
            async for _ in fs.aiter_bytes():
                break
        with trio.fail_after(10):
            await engine.stats.wait_for(lambda s: s.aborted == 1)


async def test_statistics(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        engine.faults.reject = 1
        await client.post(COMPLETION, json=body())
        await client.post(COMPLETION, json=body(model="nope"))
        s = client.statistics()
        assert s.requests_total == 2 and s.in_flight == 0 and s.queued == 0
        assert s.retries == {("await_headers", "rejection_503"): 1}
        assert s.responses == {(engine.url, 503): 1, (engine.url, 200): 1, (engine.url, 404): 1}
        assert s.pool.active == 0


async def test_settings_overrides_validated() -> None:
    with pytest.raises(SettingsError, match="routing"):
        async with client_for(routing="random"):
            pass


async def test_an_error_in_the_client_block_comes_out_as_itself(fd_baseline: int) -> None:
    # The client's own nursery (health probes) must not wrap the caller's error in an
    # ExceptionGroup: `except EngineRejected` around the block has to catch it.
    async with open_engine() as engine:
        with pytest.raises(EngineRejected) as info:
            async with open_client(engines=[engine.url], **FAST) as client:
                await client.complete(model="nope", prompt=[1], max_tokens=2)
        assert info.value.status == 404 and completions(engine) == 1
        await engine.stop_listening()
        with pytest.raises(EngineConnectError) as connect:
            async with open_client(engines=[engine.url], **FAST) as client:
                await client.complete(model="sim-base", prompt=[1], max_tokens=2)
        assert connect.value.phase == Phase.CONNECT and completions(engine) == 1


async def test_an_error_in_the_engine_block_comes_out_as_itself(fd_baseline: int) -> None:
    with pytest.raises(KeyError):
        async with open_engine():
            raise KeyError("from the caller")


async def test_engines_given_as_one_string_are_comma_separated(fd_baseline: int) -> None:
    async with open_engine() as a, open_engine() as b:
        async with open_client(engines=f"{a.url},{b.url}", **FAST) as client:
            assert sorted(e.url for e in client.engines.list()) == sorted([a.url, b.url])
            c = await client.complete(model="sim-base", prompt=[1], max_tokens=2)
        assert c.engine in (a.url, b.url)


async def test_complete_refuses_fields_that_would_undo_its_decoding(fd_baseline: int) -> None:
    # return_token_ids=False gave empty token arrays without a word; stream=True a
    # CodecError saying the body was not JSON.
    async with open_engine() as engine, client_for(engine) as client:
        for extra in ({"return_token_ids": False}, {"stream": True}):
            with pytest.raises(ValueError, match="use client.stream"):
                await client.complete(model="sim-base", prompt=[1], max_tokens=2, **extra)
        c = await client.complete(model="sim-base", prompt=[1], max_tokens=2, top_k=5)
        assert c.choices[0].tokens.shape == (2,)
        assert completions(engine) == 1


async def _text_only_engine(stream: trio.SocketStream) -> None:
    # An engine that ignores return_token_ids: a 200 completion with text only.
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    # The client's own probes (health, engine kind detection) are GETs with no body:
    # they get a 404, as an engine without those routes answers.
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    if head.startswith(b"GET "):
        status, answer = b"404 Not Found", b'{"detail": "Not Found"}'
    else:
        status = b"200 OK"
        answer = b'{"id": "c", "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}'
    await stream.send_all(
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (status, len(answer), answer)
    )
    await stream.aclose()


async def test_complete_fails_when_the_engine_ignores_return_token_ids(fd_baseline: int) -> None:
    # A sample with no tokens is a lost sample: complete() asked for the ids, so an
    # answer without them raises instead of returning empty token arrays.
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, _text_only_engine, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        async with client_for(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(CodecError, match="without 'token_ids'"):
                await client.complete(model="m", prompt=[1, 2], max_tokens=2)
        nursery.cancel_scope.cancel()
