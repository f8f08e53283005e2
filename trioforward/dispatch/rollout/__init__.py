"""Rollout control: weight updates, versions, abort, replay and continuation (docs/operations.md).

Owns weight updates as one operation (:mod:`._weights`, :mod:`._engine_control`),
one weight version across the engines (:mod:`._versions`), aborts by request
id, group or all and the answers they leave (:mod:`._abort`,
:mod:`._abort_answer`, :mod:`._abort_answer_native`), replay after a pause
(:mod:`._replay`) and continuing what an abort pause ended, per route
(:mod:`._continue` and the ``_continue_*`` modules, :mod:`._continuing`,
:mod:`._stream_spans`).

May import :mod:`trioforward.dispatch.dialects`, :mod:`trioforward.dispatch.attempts`
and :mod:`trioforward.dispatch.engines`; never client (tests/test_layers.py).
"""
