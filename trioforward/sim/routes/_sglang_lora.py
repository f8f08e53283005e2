"""The simulated SGLang's adapter routes: ``POST /load_lora_adapter`` and
``POST /unload_lora_adapter`` (no ``/v1``; docs/sim.md, "SGLang kind").

SGLang 0.5.23 (``srt/entrypoints/http_server.py``, ``io_struct.LoRAUpdateOutput``,
``srt/lora/lora_manager.py``): both answer 200 when ``success`` else 400, with
``{"rid": null, "http_worker_ipc": null, "success", "error_message",
"loaded_adapters": {name: path}}``. Messages: a loaded name → ``Failed to load
LoRA adapter NAME because it is already loaded``; an unknown one on unload →
``LoRA with name NAME does not exist. Loaded LoRAs: ...``; LoRA off
(``runtime_lora=False``) → ``LoRA is not enabled. Please set `--enable-lora` to
enable LoRA.``. The adapter bookkeeping is the vLLM kind's (``_adapters.py``).
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.sim.core._adapters import Adapters

__all__ = ["load", "unload"]

Answer = tuple[int, bytes, bytes]
_JSON = b"application/json"
_DISABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


def _answer(adapters: Adapters, error: str | None) -> Answer:
    body: dict[str, Any] = {
        "rid": None,
        "http_worker_ipc": None,
        "success": error is None,
        "error_message": error,
        "loaded_adapters": {name: path for name, (path, _) in adapters.loaded.items()},
    }
    return (200 if error is None else 400), _JSON, orjson.dumps(body)


def _fields(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


async def load(adapters: Adapters, body: bytes) -> Answer:
    if not adapters.runtime_lora:
        return _answer(adapters, _DISABLED)
    data = _fields(body)
    name = data.get("lora_name")
    if isinstance(name, str) and name in adapters.loaded:
        return _answer(adapters, f"Failed to load LoRA adapter {name} because it is already loaded")
    status, _, text = await adapters.load(body)
    if status == 200:
        return _answer(adapters, None)
    try:
        message = orjson.loads(text)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = text.decode("utf-8", "replace")
    return _answer(adapters, str(message))


def unload(adapters: Adapters, body: bytes) -> Answer:
    if not adapters.runtime_lora:
        return _answer(adapters, _DISABLED)
    name = _fields(body).get("lora_name")
    if not isinstance(name, str) or name not in adapters.loaded:
        loaded = ", ".join(adapters.loaded)
        return _answer(adapters, f"LoRA with name {name} does not exist. Loaded LoRAs: {loaded}")
    adapters.unload(body)
    return _answer(adapters, None)
