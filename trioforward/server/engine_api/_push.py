"""Weight pushes fanned out to every engine of a kind, inside the pause, with
per-engine results and rollback (docs/operations.md, "A weight update through
the engines' own routes").

A push is one engine call (SGLang ``/update_weights_from_disk``, vLLM's
``/start_weight_update`` ...) sent to every registered engine of that kind at
once on the client's control pool (never behind generations or the pause gate).
Its outcome:

- every engine answered 2xx (and not ``"success": false``): 200; a
  ``weight_version`` the body names is kept as :class:`Pending` and recorded
  when the engines resume (``/continue_generation``, ``/resume``) — or at once
  when the push was not inside a pause, since the gateway then paused the
  engines itself (mode ``wait``: the push waits for their running generations,
  as SGLang's own writer lock does) and resumes them right after;
- some failed: **207**, each engine's result listed; what can be undone is
  (a disk push: the engines that loaded the new checkpoint load the one they
  had before, as ``GET /model_info`` named it); then every engine of the kind is
  resumed with the version unchanged — nothing is left paused — and an engine
  whose push could not be undone (a distributed transfer) is held out until it
  reports the current version (docs/operations.md, "One weight version across
  the engines");
- all failed: the engines' status (400 when they refused, 502 when none was
  reached), rolled back and resumed likewise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trioforward.server.admin._fan_out import (
    FLUSH_PATHS,
    EngineResult,
    engines_of,
    fan_out,
    flush_prefix_caches,
    kinds_known,
)
from trioforward.server.base._state import GatewayState

__all__ = [
    "EngineResult", "Pending", "PushOutcome", "engines_of", "fan_out", "kinds_known", "push",
    "pending", "flush_prefix_caches", "FLUSH_PATHS",
]  # fmt: skip

log = logging.getLogger("trioforward.server")


@dataclass(slots=True)
class Pending:
    """The weight version a push inside a pause named, per engine kind: recorded by
    the resume that ends the pause."""

    versions: dict[str, str] = field(default_factory=dict)


def pending(state: GatewayState) -> Pending:
    """This gateway's :class:`Pending` (made on first use)."""
    found = state.extras.get("engine_api_pending")
    if found is None:
        found = state.extras["engine_api_pending"] = Pending()
    assert isinstance(found, Pending)
    return found


@dataclass(frozen=True, slots=True)
class PushOutcome:
    """What a push did: the status to answer (200, 207, or the engines' error
    status), each engine's result, and the results of the rollback calls."""

    status: int
    results: list[EngineResult]
    rolled_back: list[EngineResult]

    def to_json(self) -> dict[str, Any]:
        return {
            "engines": [r.to_json() for r in self.results],
            "rolled_back": [r.to_json() for r in self.rolled_back],
        }


def _paused(state: GatewayState, urls: list[str]) -> bool:
    """True when every one of ``urls`` is paused at the engine level (the push is
    inside a trainer's pause)."""
    pauses = state.client.weights.engine_pauses
    return bool(urls) and all(url in pauses for url in urls)


async def push(
    state: GatewayState,
    kind: str,
    path: str,
    body: dict[str, Any],
    version: str | None,
    undo: Callable[[EngineResult, Any], dict[str, Any] | None] | None = None,
    before: str | None = None,
) -> PushOutcome:
    """Push ``body`` to ``path`` on every engine of ``kind`` (see the module text).

    ``version``: the weight version the push names (recorded on success).
    ``before``: a GET path read from each engine first (its answer is handed to
    ``undo``); ``undo(result, before_answer)``: the body that puts an engine whose
    push succeeded back (None: cannot be undone). Raises :class:`LookupError` when
    no engine of ``kind`` is registered.
    """
    # Imported here: _pause reads this module's Pending, this one calls its pause.
    from trioforward.server.engine_api._pause import pause_kind, resume_kind

    await kinds_known(state)
    targets = engines_of(state, kind)
    if not targets:
        raise LookupError(kind)
    urls = [e.url for e in targets]
    inside = _paused(state, urls)
    if not inside:
        await pause_kind(state, kind, "wait", False)
    seconds = state.settings.dispatch_timeout  # a checkpoint load takes what it takes
    previous: dict[str, Any] = {}
    if before is not None:
        for result in await fan_out(state, urls, "GET", before, None):
            previous[result.engine] = result.body if result.ok else None
    results = await fan_out(state, urls, "POST", path, body, seconds)
    failed = [r for r in results if not r.ok]
    if not failed:
        if inside:
            if version is not None:
                pending(state).versions[kind] = version
        else:
            await resume_kind(state, kind, version)
        return PushOutcome(200, results, [])
    # Partial or total failure: undo what can be undone, then nothing stays paused.
    rolled_back: list[EngineResult] = []
    stuck: list[str] = []
    for result in results:
        if not result.ok:
            continue
        back = None if undo is None else undo(result, previous.get(result.engine))
        if back is None:
            stuck.append(result.engine)
            continue
        rolled_back.extend(await fan_out(state, [result.engine], "POST", path, back, seconds))
    stuck.extend(r.engine for r in rolled_back if not r.ok)
    pending(state).versions.pop(kind, None)
    log.warning(
        "weight push %s failed on %s; rolled back on %d engine(s), resumed",
        path,
        ", ".join(r.engine for r in failed),
        sum(1 for r in rolled_back if r.ok),
    )
    await resume_kind(state, kind, None)
    versions = state.client.versions
    for url in stuck:  # new weights that could not be undone: no work until it matches
        versions.hold(state.client.engines.get(url), f"its weight push to {path} was not undone")
    if len(failed) < len(results):
        status = 207
    else:
        status = max((r.status for r in failed), default=0) or 502
    return PushOutcome(status, results, rolled_back)
