"""Rollout control: weight updates, versions, abort, replay and continuation (docs/operations.md).

Owns weight updates as one operation (:mod:`._weights`, :mod:`._engine_control`),
one weight version across the engines (:mod:`._versions`), aborts by request
id, group or all (:mod:`._abort`), replay after a pause (:mod:`._replay`) and
continuing what an abort pause ended, on every route, written once on
segments: the segments joined (:mod:`._continue`: ``Generation``), the one
continue loop (:mod:`._continuing`: ``continue_piece``, ``continue_aborted``),
whole answers (:mod:`._continue_whole`), streams (:mod:`._continue_stream`:
``continuing_events``), token-level requests (:mod:`._continue_tokens`) and the
spans of a stream that crossed no update (:mod:`._stream_spans`). The wire
shapes they read and write are the dialects'.

May import :mod:`trioforward.dispatch.dialects`, :mod:`trioforward.dispatch.attempts`
and :mod:`trioforward.dispatch.engines`; never client (tests/test_layers.py).
"""
