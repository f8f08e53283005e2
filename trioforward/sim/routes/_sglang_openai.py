"""The simulated SGLang's OpenAI routes (``/v1/completions``, ``/v1/chat/completions``)
as SGLang 0.5.23's OpenAI server answers them where that differs from vLLM's
(docs/sim.md, "SGLang kind"; ``srt/entrypoints/openai/serving_base.py``):

- the ``model`` field names an adapter as ``<base>:<adapter>``: what follows the
  first colon (``_parse_model_parameter`` splits there and does not check the
  base part); the adapter must be loaded (else 400 ``Got LoRA adapter that has
  never been loaded: NAME``, as ``/generate``); a name without a colon is not
  checked and is served by the base model (no 404, even for an adapter's bare
  name), and the answer's ``model`` is the name as requested;
- errors are ``{"object": "error", "message", "type", "param": null, "code"}``
  at the top level (``serving_base.py:80-143``): ``type`` ``"BadRequest"`` for
  a 400, the status as a string otherwise.

Everything else is the vLLM-shaped answer of the default kind (on purpose: the
gateway reads only ``choices[].token_ids``, ``finish_reason`` and ``usage``
from either; docs/sim.md lists what differs from SGLang's own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from trioforward.sim.model._errors import ApiError

if TYPE_CHECKING:
    from trioforward.sim.core._adapters import Adapters

__all__ = ["error_body", "served_model"]


def error_body(status: int, message: str) -> bytes:
    """SGLang's OpenAI-route error body."""
    kind = "BadRequest" if status == 400 else str(status)
    return orjson.dumps({"object": "error", "message": message, "type": kind, "param": None, "code": status})


def served_model(adapters: Adapters, requested: str) -> str:
    """The model that serves ``requested`` (an adapter for ``<base>:<adapter>``, else
    the base model). Raises :class:`ApiError` (400) for an adapter never loaded."""
    _, sep, adapter = requested.partition(":")
    adapter = adapter.strip()
    if not sep or not adapter:
        return adapters.base[0]
    if adapter not in adapters.loaded:
        raise ApiError(400, f"Got LoRA adapter that has never been loaded: {adapter}")
    return adapter
