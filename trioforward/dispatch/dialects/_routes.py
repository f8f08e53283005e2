"""The engines' own token routes as continuation reads and writes them, whole and
streamed, and the shape of every route that continues (:func:`shape_for`;
docs/operations.md, "Which routes continue"; docs/server.md, "Token routes").

- SGLang ``/generate`` (0.5.23 ``srt/managers/io_struct.py``,
  ``srt/managers/tokenizer_manager.py``): one item (``text``, ``output_ids``,
  ``meta_info`` with ``finish_reason: {"type", ...}`` and the per-token
  ``output_*`` lists) or a list of them, prompt-major, sample-minor, for a batch
  or ``n > 1``. A stream's event is the whole item so far (``index`` in a
  batch), as SGLang streams without ``--incremental-streaming-output``.
- vLLM 0.32 ``/inference/v1/generate``
  (``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``): ``choices``
  with ``token_ids``, ``logprobs.content``, ``finish_reason``, ``stop_reason``,
  ``weight_versions``; a stream's event holds one choice's new tokens, then the
  usage event when ``stream_options.include_usage`` asked for it. Each logprob
  entry is ``{"token_id": <int>, "logprob", "rank", "top_logprobs"}``; vLLM 0.32
  ignores ``return_tokens_as_token_ids`` on this route. For a caller that asks for
  it (top level or in ``sampling_params``), :func:`token_strings` adds the
  earlier releases' ``"token": "token_id:<id>"`` to each entry and top logprob
  (docs/server.md, "Token routes").

A continuation goes to the route itself: the caller's body with the prompt ids +
the tokens so far (``input_ids`` / ``token_ids``), ``n`` 1 and the budget left
(``max_new_tokens`` / ``max_tokens``). SGLang's default budget, when the caller
gave none, is 128 (``SamplingParams.max_new_tokens``), pinned; ``null`` (no
limit but the context) stays ``null``. vLLM's token route without
``max_tokens`` generates what the model length leaves (``serving.py``:
``get_max_tokens``), for prompt + tokens so far exactly what was left: the
continuation names none either. A joined answer keeps the first answer's ids
(the caller's) and has the route's ``weight_versions`` spans.
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.dispatch.dialects._events import (
    CHAT,
    COMPLETIONS,
    UNSET,
    ChatEvents,
    Events,
    payload,
    split,
    sse_event,
    usage,
)

__all__ = [
    "SGLANG", "VLLM", "NATIVE_PATHS", "CONTINUED", "SGLANG_MAX_NEW_TOKENS", "Sglang", "Vllm",
    "shape_for", "asks_token_strings", "token_strings",
]  # fmt: skip

SGLANG = "/generate"
VLLM = "/inference/v1/generate"
NATIVE_PATHS = frozenset({SGLANG, VLLM})
#: The routes whose answers and streams continue across an abort pause.
CONTINUED = frozenset({COMPLETIONS, CHAT, SGLANG, VLLM})
#: SGLang 0.5.23 ``SamplingParams.max_new_tokens`` default (``srt/sampling/sampling_params.py``).
SGLANG_MAX_NEW_TOKENS = 128
# SGLang top-level fields that a batch may give per prompt (``io_struct.py``).
_PER_ITEM = (
    "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
    "lora_path", "token_ids_logprob", "return_text_in_logprobs", "custom_logit_processor",
)  # fmt: skip


_ASK = "return_tokens_as_token_ids"


def asks_token_strings(content: bytes) -> bool:
    """Whether the JSON body ``content`` of a vLLM ``/inference/v1/generate`` call has
    ``return_tokens_as_token_ids: true``, at the top level (its name on vLLM's
    OpenAI routes) or in ``sampling_params`` (where verifiers' sampling config puts
    extra keys). Parsed only when the name is in the bytes."""
    if _ASK.encode() not in content:
        return False
    try:
        return _asks(orjson.loads(content))
    except orjson.JSONDecodeError:
        return False


def _asks(body: Any) -> bool:
    params = body.get("sampling_params") if isinstance(body, dict) else None
    return isinstance(body, dict) and (
        body.get(_ASK) is True or (isinstance(params, dict) and params.get(_ASK) is True)
    )


def _named(entry: Any) -> Any:
    """A logprob entry with ``"token": "token_id:<id>"`` added (and in its top logprobs)."""
    if not isinstance(entry, dict) or type(entry.get("token_id")) is not int:
        return entry
    out = {"token": f"token_id:{entry['token_id']}", **entry}
    top = entry.get("top_logprobs")
    if isinstance(top, list):
        out["top_logprobs"] = [_named(t) for t in top]
    return out


def _named_choice(choice: Any) -> Any:
    block = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(block, dict) or not isinstance(block.get("content"), list):
        return choice
    return {**choice, "logprobs": {**block, "content": [_named(e) for e in block["content"]]}}


def _named_doc(doc: Any) -> Any:
    if isinstance(doc, dict) and isinstance(doc.get("choices"), list):
        return {**doc, "choices": [_named_choice(c) for c in doc["choices"]]}
    return doc


def token_strings(content: bytes, stream: bool) -> bytes:
    """vLLM ``/inference/v1/generate`` answer ``content`` (a whole JSON body, or whole
    SSE events when ``stream``) with each logprob entry's ``"token":
    "token_id:<id>"`` added, as vLLM before 0.32 gave it (renderers 0.1.12 reads
    it); everything else as it was. Not JSON: unchanged."""
    if not stream:
        try:
            doc = orjson.loads(content)
        except orjson.JSONDecodeError:
            return content
        return orjson.dumps(_named_doc(doc))
    out = []
    for event in split(content):
        doc = payload(event)
        out.append(sse_event(_named_doc(doc)) if isinstance(doc, dict) else event)
    return b"".join(out)


def _meta(item: Any) -> dict[str, Any]:
    meta = item.get("meta_info") if isinstance(item, dict) else None
    return meta if isinstance(meta, dict) else {}


class _Native(Events):
    """An engine's own token route: the prompt ids are the caller's (``key``)."""

    __slots__ = ()
    native = True
    key = "token_ids"

    def head(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {}

    def prompt(self, doc: dict[str, Any], raw: dict[str, Any]) -> list[int] | None:
        return self.known_prompt(raw.get("index", 0))

    def known_prompt(self, index: int) -> list[int]:
        ids = self.body.get(self.key)
        if not isinstance(ids, list) or not ids:
            return []
        return ids[index // self.n()] if isinstance(ids[0], list) else ids

    def prompts(self) -> int:
        ids = self.body.get(self.key)
        return len(ids) if isinstance(ids, list) and ids and isinstance(ids[0], list) else 1

    def params(self, index: int) -> dict[str, Any]:
        params = self.body.get("sampling_params")
        if isinstance(params, list):
            params = params[index // self.n()] if params else {}
        return params if isinstance(params, dict) else {}

    def n(self) -> int:
        params = self.body.get("sampling_params")
        first = params[0] if isinstance(params, list) and params else params
        n = first.get("n") if isinstance(first, dict) else None
        return n if type(n) is int and n > 0 else 1

    def continuable(self) -> bool:
        return bool(self.known_prompt(0))

    def count(self) -> int:
        return self.prompts() * self.n()

    def whole(self, doc: Any) -> list[tuple[int, list[int], dict[str, Any]]] | str:
        choices = self.choices(doc)
        if not self.continuable() or len(choices) != self.count():
            return "ids"
        out = []
        for k, raw in enumerate(choices):
            segment = self.segment(raw, {})
            if segment is None or not isinstance(segment["item"].get(self.ids), list):
                return "ids"
            out.append((k, self.known_prompt(k), segment))
        return out

    def base(self, segment: dict[str, Any]) -> dict[str, Any]:
        block = segment.get("logprobs")
        lists: dict[str, list[Any]] | None = None if block is None else {k: [] for k in block}
        return {"text": "", "token_ids": [], "logprobs": lists, "item": segment["item"]}

    def continuation(self, gen: Any, left: Any, stream: bool) -> bytes:
        body = self.route_body(gen.prompt + gen.tokens, gen.index // self.n(), left)
        body["sampling_params"]["n"] = 1
        if left is not UNSET:
            body["sampling_params"][self.budget_key] = left
        return orjson.dumps({**body, "stream": stream})

    ids = "token_ids"  # an answer's output ids
    budget_key = "max_tokens"

    def route_body(self, tokens: list[int], at: int, left: Any) -> dict[str, Any]:
        raise NotImplementedError


class Sglang(_Native):
    """SGLang ``/generate``: items, whole or streamed (each event the item so far)."""

    __slots__ = ()
    path = SGLANG
    key = "input_ids"
    ids = "output_ids"
    budget_key = "max_new_tokens"

    def choices(self, doc: Any) -> list[Any]:
        return doc if isinstance(doc, list) else [doc]

    def read(self, raw: dict[str, Any], state: dict[int, Any]) -> dict[str, Any] | None:
        ids = raw.get("output_ids")
        if not isinstance(ids, list):
            return None
        index, text, meta = raw.get("index", 0), str(raw.get("text") or ""), _meta(raw)
        had, had_text = state.get(index, (0, 0))
        state[index] = (len(ids), len(text))
        reason = meta.get("finish_reason")
        lists = {k: v[had:] for k, v in meta.items() if k.startswith("output_") and isinstance(v, list)}
        return {
            "token_ids": ids[had:],
            "text": text[had_text:],
            "logprobs": lists or None,
            "finish_reason": reason.get("type") if isinstance(reason, dict) else None,
            "stop_reason": reason.get("matched") if isinstance(reason, dict) else None,
            "item": raw,
        }

    def budget(self, index: int) -> Any:
        budget = self.params(index).get("max_new_tokens", SGLANG_MAX_NEW_TOKENS)
        return budget if budget is None or type(budget) is int else UNSET

    def route_body(self, tokens: list[int], at: int, left: Any) -> dict[str, Any]:
        body, ids = self.body, self.body["input_ids"]
        out = {k: v for k, v in body.items() if k not in ("text", "rid", "stream", "stream_options")}
        if isinstance(ids[0], list):  # a batch: this prompt's own fields
            for key in _PER_ITEM:
                value = out.get(key)
                if isinstance(value, list) and len(value) == len(ids):
                    if key != "token_ids_logprob" or isinstance(value[0], list):
                        out[key] = value[at]
        out["sampling_params"] = dict(out.get("sampling_params") or {})
        out["input_ids"] = tokens
        if out.get("logprob_start_len") not in (None, -1):
            out["logprob_start_len"] = -1  # the prompt's logprobs are the first segment's
        return out

    def item(self, gen: Any) -> dict[str, Any]:
        """Generation ``gen`` as one item: every token so far, the first answer's id."""
        first, last = _meta(gen.choice["item"]), _meta(gen.last.get("item"))
        meta = {**first, **{k: v for k, v in last.items() if k == "weight_version"}}
        meta.update(gen.logprobs or {})
        if "output_token_logprobs_length" in meta:
            meta["output_token_logprobs_length"] = len(gen.tokens)
        reason = last.get("finish_reason")
        if gen.finish is None:
            reason = None
        elif not (isinstance(reason, dict) and reason.get("type") == gen.finish):
            budget = self.budget(gen.index)
            reason = {"type": gen.finish, "length": budget if type(budget) is int else len(gen.tokens)}
        meta["finish_reason"] = reason
        meta["completion_tokens"] = len(gen.tokens)
        meta.pop("weight_versions", None)
        return {**gen.choice["item"], "text": gen.text, "output_ids": gen.tokens, "meta_info": meta}

    def joined(self, doc: Any, gens: list[Any], ids: bool) -> bytes:
        items = [self.item(g) for g in gens]
        for item, gen in zip(items, gens, strict=True):
            item["meta_info"]["weight_versions"] = gen.spans
        return orjson.dumps(items if isinstance(doc, list) else items[0])

    def event(self, head: dict[str, Any], gen: Any, out: dict[str, Any], index: int) -> bytes:
        item = self.item(gen)
        if out["finish_reason"] is None:
            item["meta_info"]["finish_reason"] = None
        if "weight_versions" in out:
            item["meta_info"]["weight_versions"] = out["weight_versions"]
        return sse_event(item)

    def closing(self, head: dict[str, Any], gens: list[Any], usage: list[Any]) -> bytes:
        return b"data: [DONE]\n\n"


class Vllm(_Native):
    """vLLM ``/inference/v1/generate``: choices, whole or streamed (new tokens per event)."""

    __slots__ = ()
    path = VLLM

    def head(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {"request_id": doc.get("request_id")}

    def read(self, raw: dict[str, Any], state: dict[int, Any]) -> dict[str, Any] | None:
        block = raw.get("logprobs")
        content = block.get("content") if isinstance(block, dict) else None
        return {
            "token_ids": raw.get("token_ids"),
            "text": "",
            "logprobs": {"content": content} if isinstance(content, list) else None,
            "finish_reason": raw.get("finish_reason"),
            "stop_reason": raw.get("stop_reason"),
            "item": raw,
        }

    def budget(self, index: int) -> Any:
        budget = self.params(index).get("max_tokens", UNSET)
        return budget if type(budget) is int else UNSET

    def route_body(self, tokens: list[int], at: int, left: Any) -> dict[str, Any]:
        out = {k: v for k, v in self.body.items() if k not in ("stream", "stream_options")}
        params = self.body.get("sampling_params") or {}
        out["sampling_params"] = {k: v for k, v in params.items() if k != "prompt_logprobs"}
        out["token_ids"] = tokens
        return out

    def choice(self, gen: Any, out: dict[str, Any]) -> dict[str, Any]:
        choice = {**gen.choice["item"], "index": gen.index, "token_ids": out["token_ids"]}
        choice["finish_reason"], choice["stop_reason"] = out["finish_reason"], out["stop_reason"]
        choice["weight_versions"] = out.get("weight_versions")
        block = out["logprobs"]
        if isinstance(choice.get("logprobs"), dict) and block is not None:
            choice["logprobs"] = {**choice["logprobs"], "content": block["content"]}
        return _named_choice(choice) if self.names else choice

    @property
    def names(self) -> bool:
        """The caller asked for ``"token_id:<id>"`` token strings (:func:`asks_token_strings`)."""
        return _asks(self.body)

    def joined(self, doc: Any, gens: list[Any], ids: bool) -> bytes:
        choices = [self.choice(g, {**g.tail(True), "token_ids": g.tokens}) for g in gens]
        for choice, gen in zip(choices, gens, strict=True):
            choice["weight_versions"] = gen.spans
        out = {**doc, "choices": choices}
        out["usage"] = usage(doc, gens, len(gens[0].prompt))
        return orjson.dumps(out)

    def event(self, head: dict[str, Any], gen: Any, out: dict[str, Any], index: int) -> bytes:
        doc = {"request_id": head.get("request_id"), "usage": None, "output_mode": "tokens"}
        return sse_event({**doc, "choices": [self.choice(gen, out)]})

    def closing(self, head: dict[str, Any], gens: list[Any], use: list[Any]) -> bytes:
        options = self.body.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage")):
            return b"data: [DONE]\n\n"
        total = usage({}, gens, len(self.known_prompt(0)))
        doc = {"request_id": head.get("request_id"), "usage": total, "output_mode": "tokens"}
        return sse_event({**doc, "choices": []}) + b"data: [DONE]\n\n"


def shape_for(path: str, body: dict[str, Any]) -> Events:
    """The shape of route ``path`` (one of :data:`CONTINUED`) for the caller's ``body``."""
    shape = {CHAT: ChatEvents, SGLANG: Sglang, VLLM: Vllm}.get(path, Events)
    return shape(body)
