"""``POST /tokenize`` as vLLM serves it, over the sim's own template and tokenizer.

vLLM 0.32 (``vllm/entrypoints/serve/tokenize/protocol.py``) takes either
``{"prompt": str}`` (a completion prompt) or ``{"messages": [...]}`` (a chat,
rendered by the model's chat template, ``add_generation_prompt`` true by
default, ``tools`` passed to the template) and answers
``{"count", "max_model_len", "tokens", "token_strs"}`` (``token_strs`` only with
``return_token_strs``). The ids are exactly those the sim's chat route prompts
with (one ``"role: content\\n"`` line per message, UTF-8 bytes), so a caller
that renders turns here and sends the ids as a token prompt gets the same
prompt the chat route would build. The sim's template has no generation
prompt: ``add_generation_prompt`` changes nothing (docs/sim.md, "Tokenize").
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.sim.model._api import render_messages
from trioforward.sim.model._errors import ApiError, invalid_field, invalid_json
from trioforward.sim.model._generate import render_token, tokenize

__all__ = ["serve_tokenize"]

# vLLM reports the model length; the sim's "unlimited" is reported as vLLM's default.
_DEFAULT_MAX_MODEL_LEN = 32768


def serve_tokenize(body: bytes, max_model_len: int | None) -> tuple[int, bytes]:
    """The ``(status, body)`` of ``POST /tokenize``; 400 (vLLM's error shape) on a bad body."""
    try:
        try:
            doc = orjson.loads(body or b"{}")
        except orjson.JSONDecodeError:
            raise invalid_json(body) from None
        if not isinstance(doc, dict):
            raise invalid_field("", "dictionary", doc)
        ids = _ids(doc)
    except ApiError as exc:
        return exc.status, exc.body()
    answer: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": max_model_len or _DEFAULT_MAX_MODEL_LEN,
        "tokens": ids,
        "token_strs": [render_token(t) for t in ids] if doc.get("return_token_strs") else None,
    }
    return 200, orjson.dumps(answer)


def _ids(doc: dict[str, Any]) -> list[int]:
    if "messages" in doc:
        return render_messages(doc["messages"], doc)
    prompt = doc.get("prompt")
    if not isinstance(prompt, str):
        raise invalid_field("prompt", "string", prompt)
    return tokenize(prompt)
