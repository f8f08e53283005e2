"""The simulated engine's routes, in each engine kind's shape (docs/sim.md, "Endpoints").

Owns vLLM's OpenAI generation routes (:mod:`._completions`), the token routes'
one generation loop (:mod:`._native`) in vLLM's (:mod:`._vllm_tokens`) and
SGLang's (:mod:`._sglang_generate`) shapes and which of them a kind serves
(:mod:`._token_routes`), ``/tokenize`` (:mod:`._tokenize`), weight pushes
(:mod:`._weight_push`), load reports (:mod:`._metrics`) and SGLang's
information (:mod:`._sglang_info`), adapter (:mod:`._sglang_lora`) and OpenAI
(:mod:`._sglang_openai`) routes.

May import :mod:`trioforward.sim.model`, ``core`` and ``physics``; the engine
that calls them is named for type checking only (tests/test_layers.py).
"""
