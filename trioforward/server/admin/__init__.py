"""The admin API and the control calls behind it (docs/server.md, "Admin API").

Owns the Quart views of ``/admin/*`` (:mod:`._admin_routes`): engines, weight
updates, adapters; aborts by rollout group, request id or all
(:mod:`._abort`, also behind the engines' own abort routes); fleet-wide
control calls (:mod:`._fleet_calls`); SGLang router's worker routes
(:mod:`._router_compat`) and one log line per admin change (:mod:`._admin_log`).

May import :mod:`trioforward.server.base`, ``telemetry``, ``front`` and
``tinker`` (whose sampling sessions ``/admin/adapters`` reports); never
``engine_api``, ``proxy`` or ``app`` (tests/test_layers.py).
"""
