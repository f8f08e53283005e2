"""``model`` left out of an OpenAI body: the one model the engines serve
(docs/server.md, "The OpenAI-compatible API", "When `model` is left out").

vLLM takes a request without ``model`` (or with ``""``) as one for its base
model, the first ``--served-model-name`` (vLLM 0.32
``vllm/entrypoints/serve/engine/serving.py``, ``_is_model_supported``, and
``models/serving.py``, ``model_name``); AReaL's ``RemotevLLMEngine`` relies on it.
The gateway does the same when its engines serve **one** base model (adapters
aside): the body gets that name, so routing, adapter handling and continuation
see the model the engine will run. Several base models: 400 naming them. No
engine answered ``GET /v1/models``: the body goes on unchanged and the engine
applies its own rule.

The engines' models are asked on the control pool (``Client.engine_models``)
only by requests without a model, and kept :data:`MODELS_TTL` seconds.
"""

from __future__ import annotations

from typing import Any

import trio

from trioforward.server.base._errors import bad_request
from trioforward.server.base._state import GatewayState

__all__ = ["fill_model", "MODELS_TTL"]

MODELS_TTL = 10.0  # seconds a served-model list is reused (an engine swap shows within it)
_KEY = "served_models"


async def _base_models(state: GatewayState) -> list[str]:
    now = trio.current_time()
    cached = state.extras.get(_KEY)
    if cached is not None and now - cached[0] < MODELS_TTL:
        return list(cached[1])
    names: list[str] = []
    for card in await state.client.engine_models():
        name = card.get("id")
        if isinstance(name, str) and not card.get("parent") and name not in names:
            names.append(name)
    if names:
        state.extras[_KEY] = (now, names)
    return names


async def fill_model(state: GatewayState, data: dict[str, Any]) -> bool:
    """Give ``data`` (an OpenAI body whose ``model`` is absent, null or ``""``) the
    one base model the engines serve; True when it did (the body must be
    re-encoded). Raises :class:`RequestError` (400, ``param: "model"``) when the
    engines serve several."""
    names = await _base_models(state)
    if not names:
        return False
    if len(names) > 1:
        listed = ", ".join(repr(n) for n in names)
        raise bad_request(
            f"missing field 'model': the engines serve several models ({listed}); name one", "model"
        )
    data["model"] = names[0]
    return True
