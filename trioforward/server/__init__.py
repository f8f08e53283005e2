"""The gateway server: the dispatch core behind an OpenAI-compatible, Tinker and
admin HTTP API, served by Hypercorn's trio worker (docs/server.md).

``hypercorn -k trio "trioforward.server:create_app()"`` or ``trioforward serve``.
"""

from __future__ import annotations

from trioforward.server._app import create_app
from trioforward.server._metrics import Metrics
from trioforward.server._serve import hypercorn_config, serve
from trioforward.server._state import GatewayState, get_state

__all__ = ["create_app", "serve", "hypercorn_config", "GatewayState", "get_state", "Metrics"]
