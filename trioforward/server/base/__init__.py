"""What every part of the gateway server shares (docs/server.md).

Owns the gateway's state for the app's lifetime (:mod:`._state`,
``GatewayState``), its JSON error bodies (:mod:`._errors`, docs/server.md,
"Errors"), the validation of request bodies before anything is forwarded
(:mod:`._validate`) and which token-route requests each caller id names
(:mod:`._callers`).

The lowest server package: it may import ``trioforward.dispatch``,
``trioforward.sessions``, ``trioforward.fleet``, ``trioforward.http`` and the
top-level helpers, no other server package (tests/test_layers.py).
"""
