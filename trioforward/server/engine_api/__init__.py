"""The engines' own control routes, served by the gateway (docs/server.md, "The
engines' own control routes").

A trainer that keeps one address for generation and control (AReaL's remote
engines, SGLang-router-style setups) calls SGLang's ``/pause_generation`` or
vLLM's ``/pause`` on the gateway as it would on an engine; each becomes the
gateway's own fleet operation over every engine of that kind (``_pause.py``),
and weight pushes fan out inside the pause with per-engine results and
rollback (``_push.py``). ``_routes.py`` holds the views.

May import :mod:`trioforward.server.base`, ``telemetry``, ``front``, ``tinker``
and ``admin`` (its fleet-wide calls and JSON answers); never ``proxy`` or ``app``
(tests/test_layers.py, docs/architecture.md, "Packages").
"""

from trioforward.server.engine_api._routes import install_engine_routes

__all__ = ["install_engine_routes"]
