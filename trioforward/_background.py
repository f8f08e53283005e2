"""A nursery for the background tasks of an ``open_*`` context manager.

``open_client`` and ``open_engine`` run their own tasks (health probes, the
engine's listener) in a nursery that lives as long as the ``async with`` block.
With trio's strict exception groups (the default since trio 0.25) an exception
raised by the caller's block would come out of that nursery wrapped in an
``ExceptionGroup``, so ``except EngineRejected:`` around the block would not
catch it. The context manager is one resource to its caller, not a nursery, so
the block's own exception comes out as itself; only a failure of a background
task (alongside it or alone) stays a group. trio's documentation recommends
this for context managers that open a nursery internally ("Designing for
multiple errors", trio 0.25 release notes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

__all__ = ["open_background_nursery"]


@asynccontextmanager
async def open_background_nursery() -> AsyncIterator[trio.Nursery]:
    """``async with open_background_nursery() as nursery:`` — a nursery whose tasks
    are cancelled when the block exits (normally or not).

    An exception raised by the block propagates unwrapped when no background task
    failed; otherwise the nursery's ``ExceptionGroup`` propagates as usual.
    """
    body_error: BaseException | None = None
    unwrap = False
    try:
        async with trio.open_nursery() as nursery:
            try:
                yield nursery
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if body_error is None or group.exceptions != (body_error,):
            raise
        unwrap = True
    if unwrap:
        # Raised outside the ``except`` clause so that the group does not become
        # the error's ``__context__`` (the error's own cause chain is kept).
        assert body_error is not None
        raise body_error
