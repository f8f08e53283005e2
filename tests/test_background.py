"""open_background_nursery: the block's own error comes out as itself; a failed
background task still comes out as trio's ExceptionGroup."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trioforward._background import open_background_nursery


async def test_the_block_error_is_not_wrapped_and_keeps_its_cause() -> None:
    with pytest.raises(KeyError) as info:
        async with open_background_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            try:
                raise ValueError("root")
            except ValueError as exc:
                raise KeyError("block") from exc
    assert isinstance(info.value.__cause__, ValueError)
    assert not isinstance(info.value.__context__, BaseExceptionGroup)


async def test_background_tasks_are_cancelled_when_the_block_ends() -> None:
    cancelled = trio.Event()

    async def background() -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async with open_background_nursery() as nursery:
        nursery.start_soon(background)
        await trio.testing.wait_all_tasks_blocked()
    assert cancelled.is_set()


async def test_an_outer_cancel_passes_through() -> None:
    with trio.move_on_after(0) as scope:
        async with open_background_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            await trio.sleep_forever()
    assert scope.cancelled_caught


async def test_a_failed_background_task_stays_a_group() -> None:
    async def fail() -> None:
        raise RuntimeError("background")

    with pytest.raises(BaseExceptionGroup) as info:
        async with open_background_nursery() as nursery:
            nursery.start_soon(fail)
            await trio.sleep_forever()
    assert info.value.subgroup(RuntimeError) is not None
