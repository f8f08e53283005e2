"""Wire shapes at the edge: the token-level request and each engine's body for it (docs/dispatch.md, "Engine dialects").

Owns :class:`~trioforward.dispatch.dialects._dialect.TokenRequest` and its
rendering per engine (:mod:`._dialect_completions`, :mod:`._dialect_sglang`,
:mod:`._dialect_vllm_tokens`), the typed completion call (:mod:`._complete`)
and the token routes' shapes read and written by continuation
(:mod:`._continue_shapes`).

May import :mod:`trioforward.dispatch.attempts` and
:mod:`trioforward.dispatch.engines`; never rollout or client
(tests/test_layers.py).
"""
