"""Chat rendering for sessions: messages → the model's prompt token ids
(docs/sessions.md, "Rendering").

Two renderers answer the same question, ``await chat_ids(messages, tools,
add_generation_prompt) -> list[int]``:

- :class:`EngineRenderer` asks the engine: ``POST /tokenize`` with
  ``{"messages", "tools", "add_generation_prompt"}`` answers ``{"tokens": [...]}``
  on vLLM (``vllm/entrypoints/serve/tokenize/protocol.py``, ``TokenizeChatRequest``)
  and on the built-in sim (docs/sim.md, "Tokenize"). The default: the engine's
  own template and tokenizer, nothing to configure.
- :class:`LocalRenderer` renders in the gateway from a local model directory:
  ``tokenizer.json`` (the ``tokenizers`` library) and the chat template from
  ``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``,
  run in a ``jinja2`` sandbox with the names Hugging Face templates use
  (``messages``, ``tools``, ``add_generation_prompt``, ``bos_token``,
  ``eos_token``, ``raise_exception``, ``strftime_now``, the ``tojson`` filter,
  ``trim_blocks``/``lstrip_blocks``, loop controls; as ``transformers``'
  ``apply_chat_template`` sets them). The rendered text is encoded without
  added special tokens (the template writes its own), as vLLM's ``/tokenize``
  does by default for chat.

Both raise :class:`~trioforward.sessions.SessionError`: 400 ``render_failed`` for
messages the template or the engine refuses (the template's own
``raise_exception`` message, or the engine's error message).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from trioforward.sessions._store import SessionError

if TYPE_CHECKING:
    from trioforward.dispatch import Client

__all__ = ["Renderer", "EngineRenderer", "LocalRenderer"]


class Renderer(Protocol):
    """What renders a chat for a session turn."""

    async def chat_ids(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        add_generation_prompt: bool,
        *,
        model: str | None = None,
        tenant: Any = None,
        session: str | None = None,
    ) -> list[int]:
        """The prompt token ids of ``messages`` (and ``tools``) under the model's
        chat template; raises :class:`SessionError` (400) when they cannot be
        rendered. ``model``, ``tenant``, ``session``: of the turn (an engine
        renderer sends its request as the turn's)."""
        ...


def _refused(message: str) -> SessionError:
    return SessionError(400, f"the chat history cannot be rendered: {message}", "render_failed")


class EngineRenderer:
    """Renders through an engine's ``POST /tokenize`` (vLLM's chat form), sent with
    the dispatch ``client`` like any request (``model``; ``tenant`` for its queue;
    ``session`` for its routing key)."""

    def __init__(self, client: Client, model: str | None = None) -> None:
        self.client = client
        self.model = model

    async def chat_ids(
        self, messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool, **turn: Any
    ) -> list[int]:
        """:meth:`Renderer.chat_ids`; ``turn``: its ``model``, ``tenant``, ``session``."""
        model, tenant, session = turn.get("model"), turn.get("tenant"), turn.get("session")
        body: dict[str, Any] = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
        }
        if tools:
            body["tools"] = tools
        if model or self.model:
            body["model"] = model or self.model
        response = await self.client.request(
            "POST", "/tokenize", json=body, session=session, tenant=tenant
        )
        try:
            doc = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            doc = None
        if response.status != 200:
            error = doc.get("error") if isinstance(doc, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            raise _refused(
                f"{response.engine}/tokenize answered {response.status}: {message or response.content[:200]!r}"
            )
        tokens = doc.get("tokens") if isinstance(doc, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise _refused(f"{response.engine}/tokenize gave no token ids")
        return tokens


class LocalRenderer:
    """Renders with the chat template and tokenizer of a local model directory.

    ``LocalRenderer.from_directory(path)``; raises ``FileNotFoundError`` without a
    ``tokenizer.json`` or a chat template, ``jinja2.TemplateSyntaxError`` for a
    template that does not parse (both at load, not on a turn).
    """

    def __init__(self, template: str, tokenizer: Any, special: dict[str, str]) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template = env.from_string(template)
        self.tokenizer = tokenizer
        self.special = special

    @classmethod
    def from_directory(cls, path: str | Path) -> LocalRenderer:
        from tokenizers import Tokenizer

        root = Path(path)
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        config_path = root / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template_path = root / "chat_template.jinja"
        template = (
            template_path.read_text() if template_path.exists() else config.get("chat_template")
        )
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if not isinstance(template, str):
            raise FileNotFoundError(
                f"{root}: no chat_template.jinja and no chat_template in tokenizer_config.json"
            )
        special = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = config.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                special[name] = value
        return cls(template, tokenizer, special)

    def render_text(
        self, messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool
    ) -> str:
        """The template's text; raises :class:`SessionError` 400 on a template error."""
        from jinja2 import TemplateError

        try:
            return self.template.render(
                messages=messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                **self.special,
            )
        except _TemplateRefusal as exc:
            raise _refused(f"the chat template refused it: {exc}") from None
        except (TemplateError, TypeError, KeyError, IndexError, AttributeError, ValueError) as exc:
            raise _refused(f"the chat template failed: {type(exc).__name__}: {exc}") from None

    async def chat_ids(
        self, messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool, **turn: Any
    ) -> list[int]:
        """:meth:`Renderer.chat_ids` (the turn's ``model``, ``tenant``, ``session``
        change nothing here)."""
        text = self.render_text(messages, tools, add_generation_prompt)
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids


class _TemplateRefusal(Exception):
    pass


def _raise(message: str) -> None:
    raise _TemplateRefusal(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # transformers' chat-template tojson: json.dumps with ensure_ascii off, so
    # templates render tool schemas exactly as the model saw them in training.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
