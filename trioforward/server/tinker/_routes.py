"""The ``/api/v1`` routes the official ``tinker`` SDK calls on its sampling path.

Read from the SDK's source (0.38: ``lib/internal_client_holder.py``,
``lib/public_interfaces/service_client.py``, ``sampling_client.py``,
``lib/api_future_impl.py``, ``resources/*.py``), in the order a
``ServiceClient().create_sampling_client(...).sample(...)`` makes them:

``client/config`` -> ``client/dynamic_config`` -> ``create_session`` ->
``create_sampling_session`` -> (``samplers/{id}`` when only ``model_path`` was
given) -> ``asample`` -> ``retrieve_future`` (re-polled) ... ``session_heartbeat``
every 10 s, ``telemetry``, and ``sessions/{id}/finish`` on ``close()``.

The SDK validates responses strictly (``_strict_response_validation``): each
answer carries the literal ``type`` its pydantic model expects.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import orjson
from quart import Blueprint, Response, request

from trioforward.server.base._errors import error_body
from trioforward.server.base._validate import parse_body
from trioforward.server.tinker._requests import make_sampling_session
from trioforward.server.tinker._state import tinker_state
from trioforward.server.tinker._wire import JSON

__all__ = ["blueprint", "CLIENT_CONFIG", "DYNAMIC_CONFIG"]

log = logging.getLogger("trioforward.tinker")

blueprint = Blueprint("tinker", __name__, url_prefix="/api/v1")

# ClientConfigResponse flags (tinker/types/client_config_response.py):
# - pjwt_auth_enabled false: plain X-API-Key auth, no JWT exchange (/auth/token).
# - use_pyqwest_transport false: the SDK's plain httpx transport (HTTP/1.1 over
#   http://), the transport this gateway is tested with.
# - sample_use_retrieve_futures / sample_join_sampling_session false: the SDK polls
#   retrieve_future per request and pickled clients pick their own clone ids.
CLIENT_CONFIG = orjson.dumps(
    {
        "pjwt_auth_enabled": False,
        "credential_default_source": "api_key",
        "use_pyqwest_transport": False,
        "sample_use_retrieve_futures": False,
        "sample_join_sampling_session": False,
        "sample_max_concurrent_requests": 2000,
        "sample_no_retries": False,
    }
)
# ClientDynamicConfigResponse: no explicit cancels (abandoning a poll never
# cancels a generation here).
DYNAMIC_CONFIG = orjson.dumps({"refresh_interval_sec": 300, "sample_cancel_enabled": False})


def _json(body: bytes | dict[str, Any], status: int = 200) -> Response:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return Response(data, status=status, content_type=JSON)


def _error(status: int, message: str, code: str) -> Response:
    return _json(error_body(message, code=code), status)


async def _body() -> dict[str, Any]:
    """The body as a JSON object (``{}`` when empty); raises ``RequestError`` (400),
    answered by the app's error handler."""
    raw = await request.get_data(cache=False, as_text=False)
    return parse_body(raw if isinstance(raw, bytes) else raw.encode(), allow_empty=True)


async def _drain() -> None:
    # Every body is read, even when unused: a request body left unread on a
    # keep-alive connection stalls the next request on it.
    await request.get_data(cache=False)


@blueprint.route("/client/config", methods=["POST"])
async def client_config() -> Response:
    await _drain()
    return _json(CLIENT_CONFIG)


@blueprint.route("/client/dynamic_config", methods=["POST"])
async def client_dynamic_config() -> Response:
    await _drain()
    return _json(DYNAMIC_CONFIG)


@blueprint.route("/healthz", methods=["GET"])
async def healthz() -> Response:
    return _json({"status": "ok"})


@blueprint.route("/create_session", methods=["POST"])
async def create_session() -> Response:
    await _body()
    return _json({"type": "create_session", "session_id": "sess-" + secrets.token_hex(8)})


@blueprint.route("/session_heartbeat", methods=["POST"])
async def session_heartbeat() -> Response:
    await _body()
    return _json({"type": "session_heartbeat"})


@blueprint.route("/sessions/<session_id>/finish", methods=["POST"])
async def finish_session(session_id: str) -> Response:
    await _drain()
    return _json({})


@blueprint.route("/telemetry", methods=["POST"])
async def telemetry() -> Response:
    await _drain()
    return _json({"status": "accepted"})


@blueprint.route("/get_server_capabilities", methods=["GET", "POST"])
async def get_server_capabilities() -> Response:
    await _drain()
    state = tinker_state()
    names = dict.fromkeys(await _engine_model_names(state.client))
    names.update(dict.fromkeys(state.known_models()))
    models = [{"model_name": m, "sampleable": True, "trainable": False} for m in names]
    return _json({"supported_models": models})


async def _engine_model_names(client: Any) -> list[str]:
    """The model names the engines list (``GET /v1/models``, a control call: never
    queued behind generations or a pause); [] if none answers in time."""
    return [str(m["id"]) for m in await client.engine_models()]


@blueprint.route("/create_sampling_session", methods=["POST"])
async def create_sampling_session() -> Response:
    body = await _body()
    state = tinker_state()
    seq = body.get("sampling_session_seq_id", 0)
    sampling_session = make_sampling_session(
        str(body.get("session_id", "")),
        seq if isinstance(seq, int) else 0,
        body.get("base_model") or None,
        body.get("model_path") or None,
        state.adapter_root,
        state.registered_adapters(),
    )
    state.remember(sampling_session)
    return _json({"type": "create_sampling_session", "sampling_session_id": sampling_session.sampler_id})


@blueprint.route("/samplers/<sampler_id>", methods=["GET"])
async def get_sampler(sampler_id: str) -> Response:
    # ``weight_version``: the version samples dispatched now run on (the SDK's
    # GetSamplerResponse ignores fields it does not know; docs/tinker.md).
    state = tinker_state()
    sampling_session = state.sampling_session(sampler_id)
    if sampling_session is None:
        return _error(404, f"unknown sampler {sampler_id!r}", "not_found")
    return _json(
        {
            "sampler_id": sampling_session.sampler_id,
            "base_model": sampling_session.base_model,
            "model_path": sampling_session.model_path,
            "weight_version": state.client.weight_version,
        }
    )


@blueprint.route("/cancel_future", methods=["POST"])
async def cancel_future() -> Response:
    # Accepted and ignored: a sample, once admitted, runs to completion.
    await _drain()
    return _json({})
