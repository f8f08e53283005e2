"""A pause or resume of every engine of one kind: the gateway's own weight-update
operation (the gate, the engines' pause, versions: docs/operations.md, "What a
pause does"), as ``POST /admin/pause`` / ``/admin/resume`` make it, fleet-wide in
fleet mode (docs/fleet.md, "Control plane").
"""

from __future__ import annotations

from trioforward.server.admin._fleet_calls import fleet_pause, fleet_wide
from trioforward.server.base._state import GatewayState
from trioforward.server.engine_api._push import engines_of, kinds_known, pending

__all__ = ["pause_kind", "resume_kind", "is_paused"]


async def pause_kind(state: GatewayState, kind: str, engine_mode: str, replay: bool | str) -> list[str]:
    """Pause every engine of ``kind`` at ``engine_mode`` (``keep``, ``retract``,
    ``wait``, ``abort``) with ``replay``; the engines' URLs. Engines already
    paused at the engine level keep their pause. Raises :class:`LookupError`
    when none is registered, :class:`~trioforward.errors.EngineControlError`."""
    await kinds_known(state)
    urls = [e.url for e in engines_of(state, kind)]
    if not urls:
        raise LookupError(kind)
    pauses = state.client.weights.engine_pauses
    todo = [url for url in urls if url not in pauses]
    if todo:
        if state.fleet is None:
            await state.client.pause(todo, "wait", engine_mode=engine_mode, replay=replay)  # type: ignore[arg-type]
        else:
            await fleet_pause(state, todo, "wait", engine_mode, replay)
    return urls


async def resume_kind(state: GatewayState, kind: str, version: str | None) -> list[str]:
    """Resume every engine of ``kind`` with ``version`` — or, when ``None``, the
    version a push inside the pause named (``_push.Pending``) — then open the
    gate; the engines' URLs. Raises :class:`LookupError` when none is registered,
    :class:`~trioforward.errors.EngineControlError`."""
    await kinds_known(state)
    urls = [e.url for e in engines_of(state, kind)]
    if not urls:
        raise LookupError(kind)
    named = pending(state).versions.pop(kind, None)
    version = version if version is not None else named
    if state.fleet is None:
        await state.client.resume(urls, weight_version=version)
    else:
        weights = state.client.weights
        engine_level = await fleet_wide(state.fleet.control.paused_at_engine_level(urls))
        await weights.resume_engines(weights.targets(engine_level), version)
        await fleet_wide(state.fleet.control.resume(urls, weight_version=version))
    return urls


def is_paused(state: GatewayState, kind: str) -> bool:
    """True while every engine of ``kind`` is paused (at the gateway's gate)."""
    engines = engines_of(state, kind)
    return bool(engines) and all(e.paused for e in engines)
