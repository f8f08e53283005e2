"""The gateway as one app and as processes (docs/server.md, "Starting it").

Owns ``create_app()``, which ties every route package to the dispatch client
(:mod:`._app`), the views it installs with the others (:mod:`._routes`:
``/livez``, ``/health``, ``/metrics``, ``GET /v1/models``), running the app
under Hypercorn's trio worker (:mod:`._serve`), ``trioforward serve``
(:mod:`._cli`) and ``--workers N`` (:mod:`._supervisor`).

The top server package: it may import every other one (tests/test_layers.py);
``trioforward.server`` re-exports its public names.
"""
