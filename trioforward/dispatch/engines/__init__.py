"""The engines and how work reaches them (docs/dispatch.md, "Engines, capacity and routing").

Owns the engine registry (:mod:`._engines`), each engine's capacity and its
weighted-fair queue (:mod:`._fair`, :mod:`._fair_order`), tenants
(:mod:`._tenants`), choosing an engine (:mod:`._routing`, :mod:`._prefix`),
engine kinds (:mod:`._kinds`), health probes (:mod:`._health`), LoRA adapters
(:mod:`._adapters`) and the run-time administration API (:mod:`._admin`).

The lowest dispatch package: it may import ``trioforward.http``,
``trioforward.errors`` and the top-level helpers, no other dispatch package
(tests/test_layers.py).
"""
