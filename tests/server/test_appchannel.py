"""The worker's request-to-app channel (``_appchannel.AppChannel``): messages in
order with backpressure (at most ``max_app_queue_size`` waiting), and the disconnect hook that lets
the OpenAI routes cancel a forward without a watcher task."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing

from trioforward.server.front._appchannel import AppChannel

BODY = {"type": "http.request", "body": b"x", "more_body": False}
END = {"type": "http.request", "body": b"", "more_body": False}
DISCONNECT = {"type": "http.disconnect"}


async def _put_waits_until(
    channel: AppChannel, message: dict[str, Any], unblock: Callable[[], Awaitable[None]]
) -> None:
    """Asserts that ``put(message)`` waits, and has returned once ``unblock()`` ran."""
    returned = False

    async def put() -> None:
        nonlocal returned
        await channel.put(message)
        returned = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(put)
        await trio.testing.wait_all_tasks_blocked()
        assert not returned
        await unblock()
        await trio.testing.wait_all_tasks_blocked()
        assert returned


async def test_messages_arrive_in_order() -> None:
    channel = AppChannel(10)
    await channel.put({"type": "http.request", "body": b"a", "more_body": True})
    await channel.put(BODY)
    assert (await channel.receive())["body"] == b"a"
    assert await channel.receive() == BODY


async def _receive_waits_for(channel: AppChannel, put: dict[str, Any]) -> dict[str, Any]:
    """Asserts that ``receive()`` waits while nothing is queued; returns what it
    got once ``put`` was put."""
    got: list[dict[str, Any]] = []

    async def receive() -> None:
        got.append(await channel.receive())

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            await channel.put(put)
    return got[0]


async def test_receive_waits_for_the_next_message() -> None:
    # The app asked before the connection read the body.
    channel = AppChannel(10)
    assert await _receive_waits_for(channel, BODY) == BODY
    assert await _receive_waits_for(channel, END) == END


async def test_a_waiting_receive_gets_the_disconnect() -> None:
    channel = AppChannel(10)
    assert await _receive_waits_for(channel, DISCONNECT) == DISCONNECT
    assert await channel.receive() == DISCONNECT


async def test_put_waits_while_the_channel_is_full() -> None:
    # Backpressure: the connection stops feeding a request body the app does not read.
    channel = AppChannel(2)
    await channel.put(BODY)
    await channel.put(BODY)

    async def read_one() -> None:
        await channel.receive()

    await _put_waits_until(channel, END, read_one)
    assert [await channel.receive() for _ in range(2)] == [BODY, END]


async def test_a_disconnect_never_waits_and_is_received_after_the_queue() -> None:
    # Hypercorn may put the disconnect from the app's own task: waiting for room
    # there would wait forever.
    channel = AppChannel(2)
    await channel.put(BODY)
    await channel.put(BODY)
    with trio.fail_after(1):
        await channel.put(DISCONNECT)
    assert channel.disconnected
    assert [await channel.receive() for _ in range(3)] == [BODY, BODY, DISCONNECT]
    assert await channel.receive() == DISCONNECT  # and again, never a wait


async def test_puts_after_the_app_ended_are_dropped() -> None:
    # Nobody will read them: a waiting put would hold the connection open for good.
    channel = AppChannel(1)
    await channel.put(BODY)

    async def app_ends() -> None:
        channel.close()

    await _put_waits_until(channel, END, app_ends)
    with trio.fail_after(1):
        await channel.put(END)
        await channel.put(DISCONNECT)


async def test_disconnect_calls_the_hook_once_and_clears_it() -> None:
    channel = AppChannel(10)
    calls: list[str] = []
    channel.on_disconnect = lambda: calls.append("hangup")
    await channel.put(BODY)
    assert calls == [] and not channel.disconnected
    await channel.put(DISCONNECT)
    assert calls == ["hangup"] and channel.disconnected
    assert channel.on_disconnect is None
    await channel.put(DISCONNECT)
    assert calls == ["hangup"]
    assert await channel.receive() == BODY  # the messages are still delivered
    assert await channel.receive() == DISCONNECT


async def test_a_disconnect_before_the_hook_is_set_is_visible() -> None:
    # The forwarder sets its hook after reading the body; a client that hung up
    # in between is seen through `disconnected`.
    channel = AppChannel(10)
    await channel.put(DISCONNECT)
    assert channel.disconnected
