"""The Tinker sampling API (``/api/v1``): the official ``tinker`` SDK samples through the gateway.

``install(app)`` registers the routes on a Quart-Trio app whose
``app.extensions["trioforward"]`` holds a :class:`~trioforward.server.base._state.GatewayState`
while it serves; the routes keep their state (future store, sample runner,
sampling sessions) in ``GatewayState.extras["tinker"]``, created on the first request.
See docs/tinker.md for what the SDK needs and how this gateway answers.

May import :mod:`trioforward.server.base`, ``telemetry`` and ``front`` (the ASGI
front's route types); never ``admin``, ``engine_api``, ``proxy`` or ``app``
(tests/test_layers.py, docs/architecture.md, "Packages").
"""

from __future__ import annotations

from typing import Any

from trioforward.server.tinker._fastpath import ROUTES as FRONT_ROUTES
from trioforward.server.tinker._futures import FutureStatistics, FutureStore
from trioforward.server.tinker._state import TinkerState, tinker_state
from trioforward.server.tinker._wire import encode_error, encode_sample_response

__all__ = [
    "install",
    "FRONT_ROUTES",
    "FutureStore",
    "FutureStatistics",
    "TinkerState",
    "tinker_state",
    "encode_sample_response",
    "encode_error",
]


def install(app: Any) -> None:
    """Register the ``/api/v1`` Tinker routes that are Quart views on ``app`` (a
    ``QuartTrio``). ``asample`` and ``retrieve_future`` (two requests per sample)
    are :data:`FRONT_ROUTES`, answered by the ASGI front that ``create_app`` puts
    in front of Quart."""
    from trioforward.server.tinker._routes import blueprint

    app.register_blueprint(blueprint)
