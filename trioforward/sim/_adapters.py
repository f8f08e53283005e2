"""Base models and LoRA adapters of a simulated engine (vLLM's model registry).

vLLM behaviour reproduced (``vllm/entrypoints/openai/serving_models.py``):

- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` → 200 text
  ``Success: LoRA adapter 'NAME' added successfully.``; a loaded name → 400
  ``The lora adapter 'NAME' has already been loaded.``; a path with no adapter
  → ``missing_status`` (404, or 400) ``Loading lora NAME failed: No adapter found for PATH``.
  A path "has no adapter" when it is in ``missing_paths`` or contains ``"missing"``.
- ``POST /v1/unload_lora_adapter {"lora_name"}`` → 200, or 404 when not loaded.
- With runtime loading disabled both answer 404 ``{"detail": "Not Found"}``
  (the routes do not exist, as vLLM without ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).
- Lazy mode (the filesystem resolver): the first request naming an adapter the
  engine *can find* gets the unknown-model error, and the adapter is loaded by
  itself ``lazy_seconds`` later. It can find the names of ``resolvable``
  (name → path); when ``resolvable`` is empty, any name without ``"missing"``
  in it (path ``/adapters/NAME``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import orjson
import trio

from trioforward.sim._api import error_body
from trioforward.sim._stats import EngineStats

__all__ = ["Adapters", "NOT_FOUND_DETAIL"]

NOT_FOUND_DETAIL = orjson.dumps({"detail": "Not Found"})

Answer = tuple[int, bytes, bytes]  # status, content type, body
_JSON = b"application/json"
_TEXT = b"text/plain; charset=utf-8"


def _err(status: int, message: str, type: str | None = None) -> Answer:
    if type is None:
        type = "NotFoundError" if status == 404 else "BadRequestError"
    return status, _JSON, error_body(message, type, status)


class Adapters:
    """Which model names an engine serves, and the adapter load/unload logic."""

    def __init__(
        self,
        stats: EngineStats,
        models: Collection[str],
        *,
        resolvable: Mapping[str, str] | None = None,
        lora_modules: Mapping[str, str] | None = None,
        lazy_seconds: float | None = None,
        missing_paths: Collection[str] = (),
        runtime_lora: bool = True,
        missing_status: int = 404,
        load_seconds: float = 0.0,
    ) -> None:
        if not models:
            raise ValueError("an engine needs at least one base model")
        self.stats = stats
        self.base: tuple[str, ...] = tuple(models)
        self.resolvable = dict(resolvable or {})
        self.loaded: dict[str, tuple[str, str]] = {  # name -> (path, parent)
            name: (path, self.base[0]) for name, path in (lora_modules or {}).items()
        }
        self.lazy_seconds = lazy_seconds
        self.missing_paths = set(missing_paths)
        self.runtime_lora = runtime_lora
        self.missing_status = missing_status
        self.load_seconds = load_seconds
        self._loading: set[str] = set()
        self._lazy_pending: set[str] = set()

    def serves(self, name: str) -> bool:
        """True if requests may name ``name`` now (a base model or a loaded adapter)."""
        return name in self.base or name in self.loaded

    def unknown(self, name: str, start_soon: Callable[..., Any]) -> Answer:
        """The answer to a request naming ``name`` that is not served.

        In lazy mode, schedules the self-load of a findable adapter with
        ``start_soon`` (once per name until it is loaded).
        """
        if self.lazy_seconds is not None and name not in self._lazy_pending:
            path = self._find(name)
            if path is not None:
                self._lazy_pending.add(name)
                start_soon(self._lazy_load, name, path)
        return _err(self.missing_status, f"The model `{name}` does not exist.")

    def _find(self, name: str) -> str | None:
        if self.resolvable:
            return self.resolvable.get(name)
        return None if "missing" in name else f"/adapters/{name}"

    def exists(self, path: str) -> bool:
        """Whether a path holds an adapter (see the module docstring)."""
        return path not in self.missing_paths and "missing" not in path

    async def _lazy_load(self, name: str, path: str) -> None:
        assert self.lazy_seconds is not None
        await trio.sleep(self.lazy_seconds)
        self._lazy_pending.discard(name)
        if name not in self.loaded:
            self._add(name, path, self.base[0])
            self.stats.lazy_loads[name] += 1
            self.stats.changed()

    def _add(self, name: str, path: str, parent: str) -> None:
        self.loaded[name] = (path, parent)
        self.stats.adapter_loads[name] += 1
        self.stats.changed()

    async def load(self, body: bytes) -> Answer:
        """Handle ``POST /v1/load_lora_adapter`` (takes ``load_seconds``)."""
        if not self.runtime_lora:
            return 404, _JSON, NOT_FOUND_DETAIL
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            req = None
        name = req.get("lora_name") if isinstance(req, dict) else None
        path = req.get("lora_path") if isinstance(req, dict) else None
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            return _err(
                400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput"
            )
        if name in self.loaded or name in self._loading or name in self.base:
            return _err(
                400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput"
            )
        if not self.exists(path):
            return _err(
                self.missing_status, f"Loading lora {name} failed: No adapter found for {path}"
            )
        parent = req.get("base_model_name") or self.base[0]
        if self.load_seconds > 0:
            self._loading.add(name)
            try:
                await trio.sleep(self.load_seconds)
            finally:
                self._loading.discard(name)
        self._add(name, path, parent if isinstance(parent, str) else self.base[0])
        return 200, _TEXT, f"Success: LoRA adapter '{name}' added successfully.".encode()

    def unload(self, body: bytes) -> Answer:
        """Handle ``POST /v1/unload_lora_adapter``."""
        if not self.runtime_lora:
            return 404, _JSON, NOT_FOUND_DETAIL
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            req = None
        name = req.get("lora_name") if isinstance(req, dict) else None
        if not isinstance(name, str) or not name:
            return _err(400, "'lora_name' must be provided.", "InvalidUserInput")
        if name not in self.loaded:
            return _err(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.loaded[name]
        self.stats.adapter_unloads[name] += 1
        self.stats.changed()
        return 200, _TEXT, f"Success: LoRA adapter '{name}' removed successfully.".encode()

    def models_body(self, created: int) -> bytes:
        """``GET /v1/models``: base models, then adapters (``parent`` = base, ``root`` = path)."""
        data = [
            {
                "id": m,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": m,
                "parent": None,
            }
            for m in self.base
        ]
        data += [
            {
                "id": n,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": path,
                "parent": parent,
            }
            for n, (path, parent) in self.loaded.items()
        ]
        return orjson.dumps({"object": "list", "data": data})
