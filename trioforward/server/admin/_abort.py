"""``POST /admin/abort``: cancel requests by rollout group, by request id, or all.

docs/operations.md, "Over-sampling: cancelling a round's stragglers". Body:
``{"group": G}``, ``{"request_ids": [...]}`` (both may be given) or
``{"all": true}``. Every matching request of the gateway — OpenAI routes and
Tinker samples, queued or on an engine — is aborted (dispatch/rollout/_abort.py) and
its caller gets a normal answer with ``finish_reason: "abort"``; Tinker samples
still waiting for a worker are resolved without reaching the dispatch core.
Answers ``{"queued", "on_engine", "finished"}``; in fleet mode every member does
its part (fleet/_control.py) and the answer adds ``"members"``: each member's
counts. An unknown group or id counts 0: not an error.
"""

from __future__ import annotations

from typing import Any

from trioforward.dispatch import bad_id_reason
from trioforward.server.base._callers import resolve
from trioforward.server.base._errors import bad_request
from trioforward.server.base._state import GatewayState

__all__ = ["abort_args", "abort_here"]


def abort_args(data: dict[str, Any]) -> tuple[list[str] | None, str | None, bool]:
    """``(request_ids, group, all)`` of an abort body; 400 naming the field otherwise."""
    group = data.get("group")
    ids = data.get("request_ids")
    every = data.get("all", False)
    if not isinstance(every, bool):
        raise bad_request("'all' must be true or false", "all")
    if group is not None:
        reason = bad_id_reason(group)
        if reason is not None:
            raise bad_request(f"'group' {reason}", "group")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise bad_request("'request_ids' must be a list of request ids (strings)", "request_ids")
        if len(ids) > 65536:
            raise bad_request("'request_ids' holds more than 65536 ids", "request_ids")
    if every and (group is not None or ids is not None):
        raise bad_request("'all' aborts every request: send it alone", "all")
    if not every and group is None and ids is None:
        raise bad_request("send 'group', 'request_ids' or 'all': true")
    return ids, group, every


async def abort_here(
    state: GatewayState, ids: list[str] | None, group: str | None, every: bool
) -> dict[str, Any]:
    """This process's part of an abort: its Tinker queue, then its dispatch client."""
    ids = resolve(state, ids)  # the caller ids of the engines' own abort routes
    queued_samples = 0
    tinker = state.extras.get("tinker")
    if tinker is not None:
        queued_samples = tinker.runner.abort(ids, group, every)
    counts = await state.client.abort(group=group, request_ids=ids, all=every)
    out: dict[str, Any] = counts.to_json()
    out["queued"] += queued_samples
    if counts.tail is not None and state.fleet is None:
        # The group ended with this abort: its tail (docs/operations.md, "Group tails").
        out["group_tail"] = counts.tail.to_json()
    return out
