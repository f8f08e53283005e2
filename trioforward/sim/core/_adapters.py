"""Base models and LoRA adapters of a simulated engine (vLLM's model registry).

vLLM 0.32 behaviour reproduced (``vllm/entrypoints/openai/serving_models.py``;
recorded answers in ``tests/sim/vllm_0_32_fixtures/``, docs/compatibility.md):

- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` → 200 plain text
  ``Success: LoRA adapter 'NAME' added successfully.`` with no content type; a
  loaded name → 400 ``InvalidUserInput`` "has already been loaded" (unless
  ``"load_inplace": true``, which loads it again); a base model's name → 400
  ``InvalidUserInput`` "conflicts with a served base model"; a path with no
  adapter → ``missing_status`` (404, or 400) ``Loading lora NAME failed: No
  adapter found for PATH`` (a path under /tmp, /home, ... shown as ``<path>``,
  as vLLM sanitizes its error messages). A path "has no
  adapter" when it is in ``missing_paths`` or contains ``"missing"``.
- ``POST /v1/unload_lora_adapter {"lora_name"}`` → 200 plain text, or 404 when not loaded.
- A missing field → 400 ``Bad Request`` with ``param: "body.FIELD"``.
- With runtime loading disabled both answer 404 ``{"detail": "Not Found"}``
  (the routes do not exist, as vLLM without ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).
- Lazy mode (the filesystem resolver, ``VLLM_LORA_RESOLVER_CACHE_DIR``): a
  request naming an adapter the engine *can find* loads it. With
  ``lazy_seconds == 0`` the request that names it is answered by it, as vLLM
  0.32 does. With ``lazy_seconds > 0`` the sim differs on purpose: the first
  request gets the unknown-model error and the adapter loads by itself
  ``lazy_seconds`` later — an engine whose resolver lags (files still being
  written), which drives the gateway's adapter-not-loaded retry path. It can
  find the names of ``resolvable`` (name → path); when ``resolvable`` is
  empty, any name without ``"missing"`` in it (path ``/adapters/NAME``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import orjson
import trio

from trioforward.sim.core._stats import EngineStats
from trioforward.sim.model._errors import error_body, missing_field, sanitize_message, unknown_model

__all__ = ["Adapters", "NOT_FOUND_DETAIL"]

NOT_FOUND_DETAIL = orjson.dumps({"detail": "Not Found"})

Answer = tuple[int, bytes, bytes]  # status, content type (b"" = none), body
_JSON = b"application/json"
_TEXT = b""  # vLLM's load/unload answers carry no content type


def _err(status: int, message: str, type: str | None = None) -> Answer:
    if type is None:
        type = "NotFoundError" if status == 404 else "BadRequestError"
    return status, _JSON, error_body(message, type, status)


def _request(body: bytes) -> dict[str, Any]:
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        req = None
    return req if isinstance(req, dict) else {}


def _permission() -> list[dict[str, Any]]:
    return [
        {
            "id": "modelperm-sim",
            "object": "model_permission",
            "created": 0,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
    ]


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
        max_model_len: int | None = None,
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
        self.owned_by = "vllm"  # /v1/models cards' owner (the engine kind's)
        self.missing_status = missing_status
        self.load_seconds = load_seconds
        self.max_model_len = max_model_len
        self._loading: set[str] = set()
        self._lazy_pending: set[str] = set()

    def serves(self, name: str) -> bool:
        """True if requests may name ``name`` now (a base model or a loaded adapter)."""
        return name in self.base or name in self.loaded

    def unknown(self, name: str, start_soon: Callable[..., Any]) -> Answer:
        """The answer to a request naming ``name`` that is not served.

        In lazy mode with a lag, schedules the self-load of a findable adapter
        with ``start_soon`` (once per name until it is loaded).
        """
        if self.lazy_seconds and name not in self._lazy_pending:
            path = self._find(name)
            if path is not None:
                self._lazy_pending.add(name)
                start_soon(self._lazy_load, name, path)
        error = unknown_model(name, self.base, self.missing_status)
        return error.status, _JSON, error.body()

    def resolve_now(self, name: str) -> bool:
        """Lazy mode without lag (vLLM's resolver): load ``name`` now if it can be found."""
        if self.lazy_seconds != 0:
            return False
        path = self._find(name)
        if path is None or not self.exists(path):
            return False
        self._add(name, path, self.base[0])
        self.stats.lazy_loads[name] += 1
        self.stats.changed()
        return True

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
        req = _request(body)
        name, path = req.get("lora_name"), req.get("lora_path")
        for field, value in (("lora_name", name), ("lora_path", path)):
            if not isinstance(value, str):
                error = missing_field(field, req)
                return error.status, _JSON, error.body()
        assert isinstance(name, str) and isinstance(path, str)
        if name in self.base:
            message = f"The lora adapter '{name}' conflicts with a served base model."
            return _err(400, message, "InvalidUserInput")
        if (name in self.loaded and not req.get("load_inplace")) or name in self._loading:
            return _err(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load "
                "the adapter in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        if not self.exists(path):
            message = f"Loading lora {name} failed: No adapter found for {path}"
            return _err(self.missing_status, sanitize_message(message))
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
        req = _request(body)
        name = req.get("lora_name")
        if not isinstance(name, str):
            error = missing_field("lora_name", req)
            return error.status, _JSON, error.body()
        if name not in self.loaded:
            return _err(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.loaded[name]
        self.stats.adapter_unloads[name] += 1
        self.stats.changed()
        return 200, _TEXT, f"Success: LoRA adapter '{name}' removed successfully.".encode()

    def models_body(self, created: int) -> bytes:
        """``GET /v1/models``: base models, then adapters (``parent`` = base, ``root`` = path).

        A base model's ``max_model_len`` is the engine's (null = unlimited); an adapter's is null.
        """
        entries: list[tuple[str, str, str | None, int | None]]
        entries = [(m, m, None, self.max_model_len) for m in self.base]
        entries += [(n, path, parent, None) for n, (path, parent) in self.loaded.items()]
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": self.owned_by,
                "root": root,
                "parent": parent,
                "max_model_len": length,
                "permission": _permission(),
            }
            for name, root, parent, length in entries
        ]
        return orjson.dumps({"object": "list", "data": data})
