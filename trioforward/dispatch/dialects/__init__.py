"""Wire shapes at the edge: every shape a request or an answer takes, each in one place (docs/dispatch.md, "Engine dialects").

Owns :class:`~trioforward.dispatch.dialects._dialect.TokenRequest` and its
rendering per engine (:mod:`._dialect_completions`, :mod:`._dialect_sglang`,
:mod:`._dialect_vllm_tokens`), the typed completion call (:mod:`._complete`);
for continuation, each route's shape — how its answers and stream events read
as segments, its continuation's body, segments written back, its closing
events: the OpenAI routes and the SSE framing (:mod:`._events`, :mod:`._chat`),
the engines' token routes and :func:`~._routes.shape_for` (:mod:`._routes`);
and the answers of a request aborted where no engine gave one
(:mod:`._abort_answers`).

May import :mod:`trioforward.dispatch.attempts` and
:mod:`trioforward.dispatch.engines`; never rollout or client
(tests/test_layers.py).
"""
