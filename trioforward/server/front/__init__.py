"""The gateway's HTTP front: the bytes in and out, below every route (docs/server.md).

Owns the ASGI front that answers the hot routes before Quart sees them
(:mod:`._asgi`) and what one of its requests leaves behind (:mod:`._outcome`),
who may call what (:mod:`._auth`, docs/server.md, "Authentication"), and the
private hooks into Hypercorn 0.18 that carry the bytes: the trio worker
(:mod:`._worker`), one connection (:mod:`._tcpserver`), the lean per-request
stream (:mod:`._leanstream`), the framings refused as JSON (:mod:`._h11front`),
the app channel (:mod:`._appchannel`) and the collector pause during a burst
(:mod:`._gc`). Each hook's docstring lists what it relies on;
tests/server/test_private_hooks.py fails when Hypercorn changes under it
(docs/performance.md lists what each one buys).

May import :mod:`trioforward.server.base` and :mod:`trioforward.server.telemetry`;
no route package (tests/test_layers.py).
"""
