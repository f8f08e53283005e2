"""The embedded client: ``async with trioforward.open_client(...) as client`` (docs/embedding.md).

Owns :class:`~trioforward.dispatch.client._client.Client` and its calls:
forwarding (:mod:`._forwarding`, :mod:`._forward_stream`), token-level sampling
(:mod:`._sampling`), weight-update gating (:mod:`._gating`) and control calls
(:mod:`._control`).

The top dispatch package: it may import every other one
(tests/test_layers.py); ``trioforward.dispatch`` re-exports its public names.
"""
