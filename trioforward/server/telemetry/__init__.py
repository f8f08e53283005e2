"""What the gateway reports about itself: metrics and traces.

Owns the Prometheus metrics of ``/metrics`` (:mod:`._metrics`; per tenant
:mod:`._metrics_tenants`; summed over the workers of one box
:mod:`._metrics_box`; docs/server.md, "Metrics (`GET /metrics`)") and the
traces (:mod:`._tracing`, exported by one bounded thread :mod:`._span_export`;
docs/operations.md, "End-to-end traces").

May import :mod:`trioforward.server.base`; knows no route (tests/test_layers.py).
"""
