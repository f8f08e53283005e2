"""Every error names the phase its attempt was really in (docs/semantics.md, "Phases").

One table over the ways an attempt can end: a failure, a deadline, the engine's
status, and cancellation from outside (pause ``mode="abort"``, engine removal) in
each phase from CONNECT to READ_BODY. Each row asserts the error, its phase, the
attempt count and that nothing is left behind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.dispatch import Client
from trioforward.errors import (
    DispatchAborted,
    DispatchTimeout,
    EngineConnectError,
    EngineRejected,
    TrioforwardError,
    UpstreamBroken,
)
from trioforward.http import Phase
from trioforward.sim import SimEngine, open_engine

# Larger than loopback's socket buffers with nobody reading: the write blocks in SEND.
HUGE = b'{"model": "sim-base", "prompt": "' + b"x" * (64 << 20) + b'"}'


async def _post(client: Client, reached: trio.Event) -> Any:
    return await client.post(COMPLETION, json=body(max_tokens=30))


async def _post_huge(client: Client, reached: trio.Event) -> Any:
    return await client.post(COMPLETION, content=HUGE)


async def _complete_unknown_model(client: Client, reached: trio.Event) -> Any:
    return await client.complete(model="nope", prompt=[1, 2], max_tokens=2)


async def _stream(client: Client, reached: trio.Event) -> Any:
    async with client.stream(COMPLETION, json=body(max_tokens=30, stream=True)) as fs:
        async for _ in fs.aiter_bytes():
            reached.set()  # a body chunk arrived: READ_BODY


async def _abort(client: Client, engine: SimEngine) -> None:
    await client.pause(mode="abort")
    await client.resume()


async def _remove(client: Client, engine: SimEngine) -> None:
    client.engines.remove(engine.url)


async def _running(engine: SimEngine, reached: trio.Event) -> None:
    await engine.stats.wait_for(lambda s: s.running >= 1)


async def _streaming(engine: SimEngine, reached: trio.Event) -> None:
    await reached.wait()


async def _blocked_send(engine: SimEngine, reached: trio.Event) -> None:
    # Connected (a loopback connect takes microseconds) and blocked writing the
    # 64 MiB body nobody reads: nothing in the process can move any more.
    await trio.testing.wait_all_tasks_blocked(cushion=0.1)


@dataclass
class Row:
    name: str
    engine: dict[str, Any]
    knobs: dict[str, Any]
    call: Callable[[Client, trio.Event], Awaitable[Any]]
    error: type[TrioforwardError]
    phase: Phase
    attempts: int = 1
    faults: dict[str, Any] | None = None
    # Once ``when`` returns (the attempt reached the phase), ``then`` ends it from outside.
    when: Callable[[SimEngine, trio.Event], Awaitable[None]] | None = None
    then: Callable[[Client, SimEngine], Awaitable[None]] | None = None


SLOW = {"decode_ms_per_token": 50}
ROWS = [
    Row("connect refused", {}, {"connect_retries": 0}, _post, EngineConnectError, Phase.CONNECT,
        faults={"stop_listening": True}),
    Row("send: dispatch deadline", {}, {"dispatch_timeout": 1.0}, _post_huge, DispatchTimeout,
        Phase.SEND, faults={"pause_accept": True}),
    Row("send: pause abort", {}, {}, _post_huge, DispatchAborted, Phase.SEND,
        faults={"pause_accept": True}, when=_blocked_send, then=_abort),
    Row("await_headers: dispatch deadline", {}, {"dispatch_timeout": 1.0}, _post,
        DispatchTimeout, Phase.AWAIT_HEADERS, faults={"pause_accept": True}),
    Row("await_headers: engine closes (fresh connection)", {}, {}, _post, UpstreamBroken,
        Phase.AWAIT_HEADERS, faults={"drop": 1}),
    Row("await_headers: engine status", {}, {}, _complete_unknown_model, EngineRejected,
        Phase.AWAIT_HEADERS),
    Row("await_headers: pause abort", SLOW, {}, _post, DispatchAborted, Phase.AWAIT_HEADERS,
        when=_running, then=_abort),
    Row("await_headers: engine removed", SLOW, {}, _post, DispatchAborted, Phase.AWAIT_HEADERS,
        when=_running, then=_remove),
    Row("read_body: read_timeout", {}, {"read_timeout": 0.3}, _post, DispatchTimeout,
        Phase.READ_BODY, faults={"stall_body": 1}),
    Row("read_body: engine closes mid-body", {}, {}, _post, UpstreamBroken, Phase.READ_BODY,
        faults={"cut": 1}),
    Row("read_body: engine closes mid-stream", SLOW, {}, _stream, UpstreamBroken,
        Phase.READ_BODY, faults={"cut": 1}),
    Row("read_body: stream, pause abort", SLOW, {}, _stream, DispatchAborted, Phase.READ_BODY,
        when=_streaming, then=_abort),
    Row("read_body: stream, engine removed", SLOW, {}, _stream, DispatchAborted,
        Phase.READ_BODY, when=_streaming, then=_remove),
    Row("read_body: stream, dispatch deadline", {}, {"dispatch_timeout": 1.0}, _stream,
        DispatchTimeout, Phase.READ_BODY, faults={"stall_body": 1}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
async def test_error_names_the_phase_the_attempt_reached(row: Row, fd_baseline: int) -> None:
    async with open_engine(**row.engine) as engine, client_for(engine, **row.knobs) as client:
        faults = dict(row.faults or {})
        if faults.pop("stop_listening", False):
            await engine.stop_listening()
        engine.faults.update(faults)
        errors: list[TrioforwardError] = []
        reached = trio.Event()

        async def call() -> None:
            with pytest.raises(row.error) as info:
                await row.call(client, reached)
            errors.append(info.value)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                if row.when is not None and row.then is not None:
                    await row.when(engine, reached)
                    await row.then(client, engine)
        engine.faults.update({"reset": True})
        [err] = errors
        assert err.phase is row.phase, (err.phase, err)
        assert err.to_json()["error"]["phase"] == row.phase.value
        assert err.attempts == row.attempts
        assert err.engine == engine.url


async def test_abort_while_waiting_for_a_connection_slot_is_connect(fd_baseline: int) -> None:
    # Capacity 2 but one connection: the second request is dispatched and waits
    # for the connection slot, so no byte of it was sent.
    async with (
        open_engine(decode_ms_per_token=50) as engine,
        client_for(engine, engine_capacity=2, max_connections_per_engine=1) as client,
    ):
        errors: list[TrioforwardError] = []

        async def call() -> None:
            with pytest.raises(DispatchAborted) as info:
                await client.post(COMPLETION, json=body(max_tokens=30))
            errors.append(info.value)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await engine.stats.wait_for(lambda s: s.running == 1)
                nursery.start_soon(call)
                await trio.testing.wait_all_tasks_blocked()
                assert client.statistics().pool.waiting == 1
                await client.pause(mode="abort")
        assert sorted(e.phase.value for e in errors) == ["await_headers", "connect"]
        assert [e.attempts for e in errors] == [1, 1]
        assert completions(engine) == 1  # the second never reached the engine
        await client.resume()
