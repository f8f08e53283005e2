"""What every route of the gateway shares, for the app's lifetime."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from trioforward import Settings

if TYPE_CHECKING:
    from trioforward.dispatch import Client

__all__ = ["GatewayState", "get_state", "STATE_KEY"]

STATE_KEY = "trioforward"


@dataclass(slots=True)
class GatewayState:
    """Held in ``app.extensions["trioforward"]`` while the app serves.

    ``client`` is the dispatch core, open for the app's lifetime; ``nursery`` is a
    server-lifetime nursery for background work that must outlive a request
    (Tinker futures); ``metrics`` is the server's metrics object; ``fleet`` this
    process's fleet membership (``None`` without ``state_url``); ``tracing`` its
    span export (``None`` when off: docs/operations.md, "End-to-end traces"); ``extras`` lets a
    route module keep its own state (e.g. the Tinker future store) by name;
    ``on_drain``: called with the drain's cutoff (``trio.current_time()`` clock)
    when the SIGTERM drain starts, beside the dispatch client's own drain, by a
    route module that queues work of its own (Tinker's samples beyond capacity).
    """

    settings: Settings
    client: Client
    nursery: trio.Nursery
    metrics: Any = None
    fleet: Any = None  # trioforward.fleet.Fleet when state_url is set (docs/fleet.md)
    tracing: Any = None  # _tracing.GatewayTracing when traces are exported, else None
    extras: dict[str, Any] = field(default_factory=dict)
    on_drain: list[Callable[[float], None]] = field(default_factory=list)


def get_state() -> GatewayState:
    """The state of the app handling the current request.

    Raises :class:`~trioforward.server.base._errors.RequestError` 503 ``not_ready``
    (with ``Retry-After: 1``) before startup has completed or after shutdown:
    every Quart route answers as the hot routes do, never a 500.
    """
    from quart import current_app

    state: GatewayState | None = current_app.extensions.get(STATE_KEY)
    if state is None:
        from trioforward.server.base._errors import RequestError

        raise RequestError(
            503, "gateway is not serving", type="server_error", code="not_ready", retry_after=1
        )
    return state
