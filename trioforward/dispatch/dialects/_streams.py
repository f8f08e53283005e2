"""The token routes' stream shapes, and the stream shape of every route a stream
continues on (docs/operations.md, "Which routes continue").

- SGLang ``/generate`` with ``"stream": true`` (0.5.23,
  ``srt/managers/tokenizer_manager.py``): each event is the whole item so far
  (``text``, ``output_ids``, ``meta_info`` with ``output_token_logprobs``;
  ``index`` in a batch or with ``n > 1``), as SGLang streams without
  ``--incremental-streaming-output``; the last one carries ``finish_reason``.
  A continued item's events go on the same way: every token so far, the
  caller's ``meta_info.id``.
- vLLM 0.32 ``/inference/v1/generate`` with ``"stream": true``
  (``vllm/entrypoints/scale_out/token_in_token_out/serving.py``): one event per
  choice and step with the new ``token_ids`` and ``logprobs.content``, the last
  with ``finish_reason`` and ``weight_versions``, then the usage event when
  ``stream_options.include_usage`` asked for it.

Both continue on their own route, streamed, with the body
:mod:`._continue_shapes` writes for a whole answer's continuation.
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.dispatch.dialects._continue_shapes import (
    SGLANG,
    SGLANG_MAX_NEW_TOKENS,
    VLLM,
    Sglang,
    Vllm,
)
from trioforward.dispatch.dialects._events import CHAT, UNSET, ChatEvents, Events, sse_event

__all__ = ["SglangEvents", "VllmEvents", "events_for", "STREAMED"]

#: The routes whose streams continue across an abort pause.
STREAMED = frozenset({"/v1/completions", CHAT, SGLANG, VLLM})


def _meta(item: Any) -> dict[str, Any]:
    meta = item.get("meta_info") if isinstance(item, dict) else None
    return meta if isinstance(meta, dict) else {}


class _Native(Events):
    """An engine's own token route: the prompt ids are the caller's."""

    __slots__ = ()
    native = True
    key = "token_ids"  # the body's prompt ids
    route: Any = Vllm

    def head(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {}

    def prompt(self, doc: dict[str, Any], raw: dict[str, Any]) -> list[int] | None:
        return self.known_prompt(raw.get("index", 0))

    def known_prompt(self, index: int) -> list[int]:
        ids = self.body.get(self.key)
        if not isinstance(ids, list) or not ids:
            return []
        return ids[index // self.n()] if isinstance(ids[0], list) else ids

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

    def base(self, segment: dict[str, Any]) -> dict[str, Any]:
        block = segment.get("logprobs")
        lists: dict[str, list[Any]] | None = None if block is None else {k: [] for k in block}
        return {"text": "", "token_ids": [], "logprobs": lists, "item": segment["item"]}

    def continuation(self, gen: Any, left: Any) -> bytes:
        at = gen.index // self.n()
        body = self.route.body(self.body, gen.prompt + gen.tokens, at, left)
        return orjson.dumps({**body, "stream": True})


class SglangEvents(_Native):
    """SGLang ``/generate`` events: each the item so far."""

    __slots__ = ()
    path = SGLANG
    key = "input_ids"
    route = Sglang

    def choices(self, doc: dict[str, Any]) -> list[Any]:
        return [doc]

    def read(self, raw: dict[str, Any], state: dict[int, Any]) -> dict[str, Any] | None:
        ids = raw.get("output_ids")
        if not isinstance(ids, list):
            return None
        index, text, meta = raw.get("index", 0), str(raw.get("text") or ""), _meta(raw)
        lps = meta.get("output_token_logprobs")
        had, had_text, had_lps = state.get(index, (0, 0, 0))
        state[index] = (len(ids), len(text), len(lps) if isinstance(lps, list) else 0)
        reason = meta.get("finish_reason")
        return {
            "index": index,
            "token_ids": ids[had:],
            "text": text[had_text:],
            "logprobs": {"output_token_logprobs": lps[had_lps:]} if isinstance(lps, list) else None,
            "finish_reason": reason.get("type") if isinstance(reason, dict) else None,
            "stop_reason": reason.get("matched") if isinstance(reason, dict) else None,
            "item": raw,
        }

    def budget(self, index: int) -> Any:
        budget = self.params(index).get("max_new_tokens", SGLANG_MAX_NEW_TOKENS)
        return budget if budget is None or type(budget) is int else UNSET

    def event(self, head: dict[str, Any], gen: Any, out: dict[str, Any], index: int) -> bytes:
        first, last = _meta(gen.choice["item"]), gen.last.get("item")
        meta = {**_meta(last), "id": first.get("id"), "prompt_tokens": first.get("prompt_tokens")}
        if "input_token_logprobs" in first:
            meta["input_token_logprobs"] = first["input_token_logprobs"]
        reason = _meta(last).get("finish_reason")
        finish = out["finish_reason"]
        if finish is not None and not (isinstance(reason, dict) and reason.get("type") == finish):
            budget = self.budget(index)
            reason = {"type": finish, "length": budget if type(budget) is int else len(gen.tokens)}
        meta["finish_reason"] = None if finish is None else reason
        meta["completion_tokens"] = len(gen.tokens)
        if gen.logprobs is not None:
            meta["output_token_logprobs"] = gen.logprobs["output_token_logprobs"]
            if "output_token_logprobs_length" in meta:
                meta["output_token_logprobs_length"] = len(gen.tokens)
        meta.pop("weight_versions", None)
        if "weight_versions" in out:
            meta["weight_versions"] = out["weight_versions"]
        item = {"text": gen.text, "output_ids": gen.tokens, "meta_info": meta}
        if "index" in gen.choice["item"]:
            item["index"] = index
        return sse_event(item)

    def closing(self, head: dict[str, Any], gens: list[Any], usage: list[Any]) -> bytes:
        return b"data: [DONE]\n\n"


class VllmEvents(_Native):
    """vLLM ``/inference/v1/generate`` events: each choice's new tokens."""

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
        budget = self.params(index).get("max_tokens")
        return budget if type(budget) is int else UNSET

    def event(self, head: dict[str, Any], gen: Any, out: dict[str, Any], index: int) -> bytes:
        choice = {**gen.choice["item"], "index": index, "token_ids": out["token_ids"]}
        choice["finish_reason"], choice["stop_reason"] = out["finish_reason"], out["stop_reason"]
        choice["weight_versions"] = out.get("weight_versions")
        choice["logprobs"] = None if out["logprobs"] is None else {"content": out["logprobs"]["content"]}
        doc = {"request_id": head.get("request_id"), "usage": None, "output_mode": "tokens"}
        return sse_event({**doc, "choices": [choice]})

    def closing(self, head: dict[str, Any], gens: list[Any], usage: list[Any]) -> bytes:
        options = self.body.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage")):
            return b"data: [DONE]\n\n"
        prompt = len(self.known_prompt(0))
        completion = sum(len(g.tokens) for g in gens)
        use = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
        doc: dict[str, Any] = {"request_id": head.get("request_id"), "usage": use, "output_mode": "tokens", "choices": []}
        return sse_event(doc) + b"data: [DONE]\n\n"


def events_for(path: str, body: dict[str, Any]) -> Events:
    """The stream shape of route ``path`` (one of :data:`STREAMED`)."""
    if path == CHAT:
        return ChatEvents(body)
    if path == SGLANG:
        return SglangEvents(body)
    if path == VLLM:
        return VllmEvents(body)
    return Events(body)
