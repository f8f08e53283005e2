"""One request from QUEUED to its answer: the attempt loop and the retry rules (docs/design.md, "Retry rules").

Owns the request's state and header rules (:mod:`._request`), its identity
(:mod:`._identity`), the pure retry policy (:mod:`._policy`) and budget
(:mod:`._budget`), waiting for capacity (:mod:`._queueing`), draining
(:mod:`._drain`), attempts on one engine (:mod:`._attempts`), the dispatcher
that ties them (:mod:`._dispatch`), outcomes (:mod:`._outcome`), traces
(:mod:`._tracing`), ``Retry-After`` hints (:mod:`._hint`) and the value objects
the client returns (:mod:`._types`, :mod:`._counts`).

May import :mod:`trioforward.dispatch.engines` (and ``trioforward.http``); never
dialects, rollout or client (tests/test_layers.py).
"""
