"""Who may call what, and for which tenant: client API keys and the admin token
(docs/server.md, "Authentication"; docs/dispatch.md, "Tenants and fair queueing").

- ``/v1/*`` (OpenAI API), the token routes ``/generate``, ``/inference/v1/generate``
  and vllm-router's ``/finish_session``:
  ``Authorization: Bearer <key>`` with a key from ``api_keys`` or a tenant's
  ``keys``; the key names the request's tenant.
- ``/api/v1/*`` (Tinker API): ``X-API-Key: <key>`` (what the tinker SDK sends);
  a Bearer key is accepted too.
- ``/admin/*``, the router's worker routes and the engines' own control routes
  (``engine_api/``): ``Authorization: Bearer <admin_token>``.
- ``/health``, ``/livez``, ``/readyz`` and ``/metrics`` are open (probes and scrapers).

With no keys configured the client paths are open (one tenant); with no admin
token the admin paths are open. Client keys are looked up by their SHA-256 digest
(``TenantTable.for_key``: the time taken does not depend on how much of a key
matched); the admin token is compared with :func:`hmac.compare_digest`. A key is
never logged: a request is known by its tenant's name.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from trioforward import Settings
from trioforward.dispatch import Tenant, TenantTable
from trioforward.server.base._errors import RequestError

__all__ = ["check_auth"]


def _matches(given: str | None, allowed: tuple[str, ...]) -> bool:
    if not given:
        return False
    ok = False
    for key in allowed:  # no early exit: the time taken does not depend on which key matched
        ok |= hmac.compare_digest(given.encode(), key.encode())
    return ok


def _bearer(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


# The engines' own token routes and their abort routes (docs/server.md, "Token
# routes"), and vllm-router's /finish_session (_router_compat.py): client paths.
_TOKEN_ROUTES = frozenset(
    {"/generate", "/inference/v1/generate", "/abort_request", "/inference/v1/abort_requests", "/finish_session"}
)

# _router_compat's worker routes and the engines' own control routes (engine_api/,
# docs/server.md, "The engines' own control routes"). Listed here, not imported, so
# the front needs nothing from the route packages above it (docs/architecture.md,
# "Packages"); tests/server/test_auth.py fails on an engine route missing here.
_ADMIN_PATHS = frozenset(
    {
        "/add_worker", "/remove_worker",
        "/pause_generation", "/continue_generation", "/update_weights_from_disk", "/flush_cache",
        "/model_info", "/get_model_info", "/pause", "/resume", "/is_paused", "/weight_info",
        "/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
        "/finish_weight_update", "/reset_prefix_cache",
    }
)  # fmt: skip


def check_auth(
    settings: Settings, path: str, header: Callable[[str], str | None], tenants: TenantTable
) -> Tenant | None:
    """The tenant of a request to ``path`` (``None``: no key is configured, so the
    default tenant; or not a client path). Raises :class:`RequestError` (401)
    unless the request may use ``path``.

    ``header(name)`` returns a request header (lower-case name) or ``None``.
    """
    if path.startswith("/v1/") or path in _TOKEN_ROUTES:
        if tenants.keys:
            tenant = tenants.for_key(_bearer(header("authorization")))
            if tenant is None:
                raise _unauthorized("a valid API key is required: Authorization: Bearer <key>")
            return tenant
    elif path.startswith("/api/v1/"):
        if tenants.keys:
            tenant = tenants.for_key(header("x-api-key") or _bearer(header("authorization")))
            if tenant is None:
                raise _unauthorized("a valid API key is required: X-API-Key: <key>")
            return tenant
    elif path.startswith("/admin") or path in _ADMIN_PATHS:
        if settings.admin_token is not None:
            if not _matches(_bearer(header("authorization")), (settings.admin_token,)):
                raise _unauthorized("the admin token is required: Authorization: Bearer <token>")
    return None


def _unauthorized(message: str) -> RequestError:
    return RequestError(401, message, type="authentication_error", code="invalid_api_key")
