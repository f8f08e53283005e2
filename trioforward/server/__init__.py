"""The gateway server: the dispatch core behind an OpenAI-compatible, Tinker and
admin HTTP API, served by Hypercorn's trio worker (docs/server.md).

``hypercorn -k trio "trioforward.server:create_app()"`` or ``trioforward serve``.
"""

from __future__ import annotations

from trioforward import _h11

# Before anything here imports Hypercorn: its HTTP/1.1 protocol imports ``h11`` by
# name, and this makes that name the implementation trioforward._h11 chose (the
# compiled h11-mypyc when installed). docs/server.md, "Which h11 the front uses".
_h11.use_for_front()

from trioforward.server.app._app import create_app  # noqa: E402
from trioforward.server.app._serve import hypercorn_config, serve  # noqa: E402
from trioforward.server.base._state import GatewayState, get_state  # noqa: E402
from trioforward.server.telemetry._metrics import Metrics  # noqa: E402

__all__ = ["create_app", "serve", "hypercorn_config", "GatewayState", "get_state", "Metrics"]
