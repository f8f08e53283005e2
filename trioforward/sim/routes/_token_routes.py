"""Which token routes a simulated engine serves, and the dispatch to them
(docs/sim.md, "Token routes"): SGLang's ``/generate`` and ``/abort_request``
(kind ``sglang``); vLLM's ``/inference/v1/generate`` and
``/inference/v1/abort_requests`` (vLLM kinds with ``scale_out``, as vLLM 0.32's
``--enable-scale-out``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from trioforward.sim.routes import _sglang_generate, _vllm_tokens
from trioforward.sim.routes._native import serve_native

if TYPE_CHECKING:
    from trioforward.sim.core._http import Exchange
    from trioforward.sim.engine._engine import SimEngine

__all__ = ["token_paths", "serve_token_route", "CONTROL_PATHS"]

#: Token-route paths that are not generations (no disconnect watcher, no fault).
CONTROL_PATHS = frozenset({"/abort_request", _vllm_tokens.ABORT_PATH})
_JSON = b"application/json"


#: vLLM 0.32 without ``--enable-scale-out`` keeps the scale-out paths registered with
#: a stand-in that answers every POST 403 (``vllm/entrypoints/scale_out/factories.py``,
#: ``disabled_scale_out``; body as ``create_error_response`` makes it).
DISABLED_BODY = (
    b'{"error":{"message":"Scale-out endpoints are disabled. Restart vllm serve with '
    b'--enable-scale-out to enable them.","type":"PermissionDeniedError","param":null,'
    b'"code":403}}'
)


def disabled_paths(kind: str, scale_out: bool) -> frozenset[str]:
    """The token-route paths a vLLM kind answers 403 (POST) / 405 (other methods)."""
    if not scale_out and kind in ("vllm", "none"):
        return frozenset({_vllm_tokens.PATH, _vllm_tokens.ABORT_PATH})
    return frozenset()


async def serve_disabled(ex: Exchange, method: bytes) -> None:
    if method != b"POST":
        return await ex.respond(405, _JSON, b'{"detail":"Method Not Allowed"}')
    return await ex.respond(403, _JSON, DISABLED_BODY)


def token_paths(kind: str, scale_out: bool) -> frozenset[str]:
    if kind == "sglang":
        return frozenset({_sglang_generate.PATH, "/abort_request"})
    if scale_out and kind in ("vllm", "none"):
        return frozenset({_vllm_tokens.PATH, _vllm_tokens.ABORT_PATH})
    return frozenset()


async def serve_token_route(
    engine: SimEngine, ex: Exchange, method: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes
) -> None:
    path = ex.path
    if path in CONTROL_PATHS:
        if method != b"POST":
            return await ex.respond(405, _JSON, b'{"detail":"Method Not Allowed"}')
        if path == "/abort_request":
            return await ex.respond(*_sglang_generate.abort_request(engine, body))
        return await ex.respond(*_vllm_tokens.abort_requests(engine, body))
    if method not in (b"POST", b"PUT") or (method == b"PUT" and path == _vllm_tokens.PATH):
        return await ex.respond(405, _JSON, b'{"detail":"Method Not Allowed"}')
    route = _sglang_generate if path == _sglang_generate.PATH else _vllm_tokens
    await serve_native(engine, ex, route, body, dict(headers))
