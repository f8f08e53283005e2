"""The Tinker sampling API (``/api/v1``): the official ``tinker`` SDK samples through the gateway.

``install(app)`` registers the routes on a Quart-Trio app whose
``app.extensions["trioforward"]`` holds a :class:`~trioforward.server._state.GatewayState`
while it serves; the routes keep their state (future store, sample runner,
samplers) in ``GatewayState.extras["tinker"]``, created on the first request.
See docs/tinker.md for what the SDK needs and how this gateway answers.
"""

from __future__ import annotations

from typing import Any

from trioforward.server.tinker._futures import FutureStatistics, FutureStore
from trioforward.server.tinker._state import TinkerState, tinker_state
from trioforward.server.tinker._wire import encode_error, encode_sample_response

__all__ = [
    "install",
    "FutureStore",
    "FutureStatistics",
    "TinkerState",
    "tinker_state",
    "encode_sample_response",
    "encode_error",
]


def install(app: Any) -> None:
    """Register the ``/api/v1`` Tinker routes on ``app`` (a ``QuartTrio``), wrapping its
    ``asgi_app`` with the fast path of the two hot calls (call before other ASGI wrappers
    that must see every request first)."""
    from trioforward.server.tinker._fastpath import TinkerFastPath
    from trioforward.server.tinker._routes import blueprint

    app.register_blueprint(blueprint)
    # asample and retrieve_future (two requests per sample) are answered in front
    # of Quart; every other route is a Quart view.
    app.asgi_app = TinkerFastPath(app, app.asgi_app)
