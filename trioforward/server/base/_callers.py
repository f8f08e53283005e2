"""Which of this process's token-route requests each caller id names, for the
engines' own abort routes (:mod:`._native_abort`; docs/server.md, "Token routes").

:mod:`._native` registers each request under the ids its caller gave it, in the
caller's tenant, for the request's life; :func:`resolve` turns the ids an abort
names (``native-id:<tenant> <caller id>``, ``native-all: <tenant>``) into the
gateway request ids the dispatch core aborts by. The abort may come from
another fleet member (docs/fleet.md, "Control plane"): every member resolves
them among its own requests.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trioforward.server.base._state import GatewayState

__all__ = ["ID", "ALL", "CallerIds", "callers", "resolve"]

#: How a caller id travels to :func:`resolve` (fleet records included). The
#: space keeps it apart from the gateway's own request ids, which have none.
ID = "native-id:"
ALL = "native-all: "


class CallerIds:
    """Which of this process's requests each ``(tenant, caller id)`` names.
    O(ids) to register and to drop, O(1) per id to look up."""

    __slots__ = ("by_id", "by_tenant")

    def __init__(self) -> None:
        self.by_id: dict[tuple[str, str], list[str]] = {}
        self.by_tenant: dict[str, dict[str, int]] = {}  # request id -> how many

    def register(self, tenant: str, ids: Iterable[str], request_id: str) -> list[str]:
        """Known from now on as ``ids`` (the caller's); returns them for :meth:`drop`."""
        keys = list(dict.fromkeys(ids))
        for caller in keys:
            self.by_id.setdefault((tenant, caller), []).append(request_id)
        live = self.by_tenant.setdefault(tenant, {})
        live[request_id] = live.get(request_id, 0) + 1
        return keys

    def drop(self, tenant: str, ids: list[str], request_id: str) -> None:
        for caller in ids:
            _remove(self.by_id, (tenant, caller), request_id)
        live = self.by_tenant.get(tenant)
        if live is not None:
            if live.get(request_id, 0) > 1:
                live[request_id] -= 1
            else:
                live.pop(request_id, None)
                if not live:
                    del self.by_tenant[tenant]


def _remove(table: dict[tuple[str, str], list[str]], key: tuple[str, str], request_id: str) -> None:
    same = table.get(key)
    if same is not None:
        same.remove(request_id)
        if not same:
            del table[key]


def callers(state: GatewayState) -> CallerIds:
    """This process's :class:`CallerIds`."""
    found = state.extras.get("native_callers")
    if found is None:
        found = state.extras["native_callers"] = CallerIds()
    return found


def resolve(state: GatewayState, ids: list[str] | None) -> list[str] | None:
    """``ids`` with every caller id (``native-id:`` / ``native-all:``, as
    :mod:`._native_abort` sends them) replaced by the gateway request ids it
    names in this process; other ids stay."""
    if not ids or not any(i.startswith((ID, ALL)) for i in ids):
        return ids
    table = callers(state)
    out: list[str] = []
    for rid in ids:
        if rid.startswith(ALL):
            out.extend(table.by_tenant.get(rid[len(ALL) :], ()))
        elif rid.startswith(ID):
            tenant, _, caller = rid[len(ID) :].partition(" ")
            out.extend(table.by_id.get((tenant, caller), ()))
        else:
            out.append(rid)
    return out
