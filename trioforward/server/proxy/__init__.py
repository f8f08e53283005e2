"""The generation routes a trainer calls, proxied to the engines (docs/server.md).

Owns OpenAI's ``POST /v1/completions`` and ``POST /v1/chat/completions``
(:mod:`._forward`), the engines' own token routes ``/generate`` and
``/inference/v1/generate`` (:mod:`._native`, docs/server.md, "Token routes") and
their abort routes (:mod:`._native_abort`), agent sessions' turns and routes
(:mod:`._sessions`, docs/sessions.md), a left-out ``model`` filled in
(:mod:`._served_model`) and ``Server-Timing`` (:mod:`._timing`).

May import :mod:`trioforward.server.base`, ``telemetry``, ``front``, ``tinker``,
``admin`` and ``engine_api``; never ``app`` (tests/test_layers.py).
"""
