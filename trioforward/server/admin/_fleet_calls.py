"""Fleet-wide control calls of the admin API and the engines' own routes
(docs/operations.md, "Fleet mode"; docs/fleet.md, "Control plane"): a pause and a
resume through the control plane, ordered against each other across members, and
the 503 a change that did not reach every member answers."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import trio

from trioforward.dispatch import fleet_pause_value
from trioforward.errors import EngineControlError, PauseOvertaken
from trioforward.server.base._errors import RequestError
from trioforward.server.base._state import GatewayState

__all__ = ["fleet_wide", "fleet_pause", "fleet_resume"]

_T = TypeVar("_T")


async def fleet_wide(change: Awaitable[_T]) -> _T:
    """Run a fleet-wide control change or read (docs/fleet.md, "Control plane");
    503 naming the members that did not apply it in time, or when Redis does not
    answer."""
    from trioforward.fleet import FleetLagging, StateUnavailable

    try:
        return await change
    except FleetLagging as err:
        raise RequestError(503, str(err), type="server_error", code="fleet_lagging") from None
    except StateUnavailable as err:
        raise RequestError(503, str(err), type="server_error", code="state_unavailable") from None


async def fleet_pause(
    state: GatewayState,
    engines: list[str] | None,
    mode: str,
    engine_mode: str | None,
    replay: bool | str,
) -> None:
    """A fleet-wide pause (docs/operations.md, "Fleet mode"): every member gates and
    does its own part through the control plane, then this member pauses the
    engines once; if that fails, the fleet is resumed and the error raised. A
    resume (on any member) that cleared the pause meanwhile overtook it: the
    engines are resumed again here, after this pause reached them, and
    :class:`PauseOvertaken` is raised (docs/operations.md, "Overlapping control
    calls")."""
    assert state.fleet is not None
    control = state.fleet.control
    await fleet_wide(control.pause(engines, fleet_pause_value(mode, engine_mode, replay)))
    if engine_mode is None:
        return
    weights = state.client.weights
    targets = weights.targets(engines)
    try:
        await weights.pause_engines(targets, engine_mode)
    except EngineControlError:
        await fleet_wide(control.resume(engines))
        # One whose pause outcome is still unknown (its rollback resume failed
        # too) stays gated on every member until a resume reaches it.
        stuck = [e.url for e in targets if e.url in weights.engine_pauses]
        if stuck:
            await fleet_wide(control.pause(stuck, fleet_pause_value("wait", "keep", False)))
        raise
    # A resume clears the pause before it resumes the engines: still listed here
    # means any resume comes after this pause reached the engines.
    still = await fleet_wide(control.paused_at_engine_level(engines))
    if still is None or {e.url for e in targets} <= set(still):
        return
    with trio.CancelScope(shield=True):
        await weights.resume_engines(targets, None)
    raise PauseOvertaken(
        "the pause was overtaken by a resume while in progress: the engines it reached"
        " are resumed",
        engine=targets[0].url if targets else None,
    )


async def fleet_resume(state: GatewayState, engines: list[str] | None, version: str | None) -> None:
    """A fleet-wide resume: the engines the fleet paused at the engine level (whoever
    paused them; a gate-only pause never calls an engine) are read, the pause is
    cleared on every member (they record ``version``, then open their gates),
    and only then are the engines resumed and told ``version``: a pause still
    reaching them finds itself cleared and resumes them again (:func:`fleet_pause`).
    An engine that fails to resume is paused again fleet-wide (``engine:keep``:
    gated on every member) until a resume reaches it."""
    assert state.fleet is not None
    control = state.fleet.control
    weights = state.client.weights
    engine_level = await fleet_wide(control.paused_at_engine_level(engines))
    await fleet_wide(control.resume(engines, weight_version=version))
    try:
        await weights.resume_engines(weights.targets(engine_level), version)
    except EngineControlError:
        failed = [url for url in weights.engine_pauses if engine_level is None or url in engine_level]
        if failed:
            await fleet_wide(control.pause(failed, fleet_pause_value("wait", "keep", False)))
        raise
