"""The two token routes' shapes for a continuation (:mod:`._continue_native`): read an
answer into per-sequence segments, write a continuation's body, join the segments
into the route's own answer. SGLang ``/generate`` (0.5.23 ``srt/managers/io_struct.py``,
``srt/managers/tokenizer_manager.py``) and vLLM 0.32 ``/inference/v1/generate``
(``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``).
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.codec import span_version
from trioforward.dispatch.dialects._events import UNSET

__all__ = [
    "SGLANG",
    "VLLM",
    "NATIVE_PATHS",
    "SGLANG_MAX_NEW_TOKENS",
    "UNSET",
    "Sequence",
    "Sglang",
    "Vllm",
]

SGLANG = "/generate"
VLLM = "/inference/v1/generate"
NATIVE_PATHS = frozenset({SGLANG, VLLM})
#: SGLang 0.5.23 ``SamplingParams.max_new_tokens`` default (``srt/sampling/sampling_params.py``).
SGLANG_MAX_NEW_TOKENS = 128
# SGLang top-level fields that a batch may give per prompt (``io_struct.py``).
_PER_ITEM = (
    "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
    "lora_path", "token_ids_logprob", "return_text_in_logprobs", "custom_logit_processor",
)  # fmt: skip


class Sequence:
    """One output sequence's segments (``item``: the first answer's item or choice)."""

    __slots__ = (
        "prompt",
        "at",
        "item",
        "tokens",
        "lists",
        "spans",
        "text",
        "last",
        "budget",
        "continuations",
    )

    def __init__(self, prompt: list[int], item: dict[str, Any], budget: Any, at: int = 0) -> None:
        self.prompt = prompt
        self.at = at  # its prompt's position in a batch
        self.item = item
        self.tokens: list[int] = []
        self.lists: dict[str, list[Any]] = {}  # per-token lists of the answer, joined
        self.spans: list[dict[str, Any]] = []
        self.text = ""
        self.last: dict[str, Any] = item
        self.budget = budget  # int, None (no limit), or UNSET (the engine's default)
        self.continuations = 0

    def add(self, ids: list[int], lists: dict[str, Any], version: str | None) -> None:
        start, end = len(self.tokens), len(self.tokens) + len(ids)
        version = span_version(version)
        if ids:
            if self.spans and self.spans[-1]["version"] == version:
                self.spans[-1]["end"] = end
            else:
                self.spans.append({"version": version, "start": start, "end": end})
        self.tokens.extend(ids)
        for key, value in lists.items():
            if isinstance(value, list):
                self.lists.setdefault(key, []).extend(value)

    def left(self) -> object:
        """Tokens left (int), ``None`` (no limit) or :data:`UNSET` (the engine's default)."""
        budget: object = self.budget
        if isinstance(budget, int):
            return budget - len(self.tokens)
        return budget


class Sglang:
    """SGLang ``/generate``: items, continuation bodies, joined answer."""

    @staticmethod
    def sequences(body: dict[str, Any], doc: Any, version: str | None) -> list[Sequence] | None:
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids:
            return None  # a text prompt: no prompt ids to continue from
        batch = isinstance(ids[0], list)
        prompts = ids if batch else [ids]
        items = doc if isinstance(doc, list) else [doc]
        params = body.get("sampling_params")
        first = params[0] if isinstance(params, list) and params else params
        n = first.get("n") if isinstance(first, dict) else None
        n = n if isinstance(n, int) and n > 0 else 1
        if len(items) != len(prompts) * n:
            return None
        out = []
        for k, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("output_ids"), list):
                return None
            p = k // n
            mine = params[p] if isinstance(params, list) else params
            mine = mine if isinstance(mine, dict) else {}
            budget = mine.get("max_new_tokens", SGLANG_MAX_NEW_TOKENS)
            pinned = budget if budget is None or isinstance(budget, int) else UNSET
            seq = Sequence(prompts[p], item, pinned, p)
            seq.text = str(item.get("text") or "")
            meta = _meta(item)
            seq.add(item["output_ids"], _lists(meta), version)
            out.append(seq)
        return out

    @staticmethod
    def aborted(seq: Sequence) -> bool:
        reason = _meta(seq.last).get("finish_reason")
        return isinstance(reason, dict) and reason.get("type") == "abort"

    @staticmethod
    def body(body: dict[str, Any], tokens: list[int], at: int, left: Any) -> dict[str, Any]:
        """The caller's ``body`` going on from ``tokens`` (prompt + tokens so far) of
        its ``at``-th prompt, ``n`` 1, ``left`` to go (:data:`UNSET`: the default)."""
        ids = body["input_ids"]
        out = {
            k: v for k, v in body.items() if k not in ("text", "rid", "stream", "stream_options")
        }
        if isinstance(ids[0], list):  # a batch: this prompt's own fields
            for key in _PER_ITEM:
                value = out.get(key)
                if isinstance(value, list) and len(value) == len(ids):
                    if key != "token_ids_logprob" or isinstance(value[0], list):
                        out[key] = value[at]
        params = dict(out.get("sampling_params") or {})
        params["n"] = 1
        if left is not UNSET:
            params["max_new_tokens"] = left
        out["sampling_params"] = params
        out["input_ids"] = tokens
        out["stream"] = False
        if out.get("logprob_start_len") not in (None, -1):
            out["logprob_start_len"] = -1  # the prompt's logprobs are the first segment's
        return out

    @staticmethod
    def read(content: bytes) -> tuple[dict[str, Any], list[int]] | None:
        doc = orjson.loads(content)
        item = doc[0] if isinstance(doc, list) and len(doc) == 1 else doc
        if not isinstance(item, dict) or not isinstance(item.get("output_ids"), list):
            return None
        return item, item["output_ids"]

    @staticmethod
    def add(seq: Sequence, item: dict[str, Any], version: str | None) -> None:
        meta = _meta(item)
        seq.add(item["output_ids"], _lists(meta), version)
        seq.text += str(item.get("text") or "")
        seq.last = item

    @staticmethod
    def end_length(seq: Sequence) -> None:
        meta = dict(_meta(seq.last))
        meta["finish_reason"] = {
            "type": "length",
            "length": seq.budget if isinstance(seq.budget, int) else len(seq.tokens),
        }
        seq.last = {**seq.last, "meta_info": meta}

    @staticmethod
    def joined(doc: Any, seqs: list[Sequence]) -> bytes:
        items = []
        for seq in seqs:
            item = dict(seq.item)
            meta = dict(_meta(seq.item))
            last = _meta(seq.last)
            meta.update(seq.lists)
            if "output_token_logprobs_length" in meta:
                meta["output_token_logprobs_length"] = len(seq.tokens)
            meta["finish_reason"] = last.get("finish_reason")
            if "weight_version" in last:
                meta["weight_version"] = last["weight_version"]
            meta["completion_tokens"] = len(seq.tokens)
            meta["weight_versions"] = seq.spans
            item["output_ids"] = seq.tokens
            item["text"] = seq.text
            item["meta_info"] = meta
            items.append(item)
        return orjson.dumps(items if isinstance(doc, list) else items[0])


class Vllm:
    """vLLM ``/inference/v1/generate``: choices, continuation bodies, joined answer."""

    @staticmethod
    def sequences(body: dict[str, Any], doc: Any, version: str | None) -> list[Sequence] | None:
        prompt = body.get("token_ids")
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(prompt, list) or not isinstance(choices, list) or not choices:
            return None
        raw = body.get("sampling_params")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        budget = params.get("max_tokens", UNSET)
        out = []
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("token_ids"), list):
                return None
            seq = Sequence(prompt, choice, budget if isinstance(budget, int) else UNSET)
            seq.add(choice["token_ids"], _content(choice), version)
            out.append(seq)
        return out

    @staticmethod
    def aborted(seq: Sequence) -> bool:
        return seq.last.get("finish_reason") == "abort"

    @staticmethod
    def body(body: dict[str, Any], tokens: list[int], at: int, left: Any) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        params = {
            k: v for k, v in (body.get("sampling_params") or {}).items() if k != "prompt_logprobs"
        }
        params["n"] = 1
        if left is not UNSET:
            params["max_tokens"] = left
        out["sampling_params"] = params
        out["token_ids"] = tokens
        out["stream"] = False
        return out

    @staticmethod
    def read(content: bytes) -> tuple[dict[str, Any], list[int]] | None:
        doc = orjson.loads(content)
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list) or len(choices) != 1:
            return None
        [choice] = choices
        if not isinstance(choice, dict) or not isinstance(choice.get("token_ids"), list):
            return None
        return choice, choice["token_ids"]

    @staticmethod
    def add(seq: Sequence, choice: dict[str, Any], version: str | None) -> None:
        seq.add(choice["token_ids"], _content(choice), version)
        seq.last = choice

    @staticmethod
    def end_length(seq: Sequence) -> None:
        seq.last = {**seq.last, "finish_reason": "length", "stop_reason": None}

    @staticmethod
    def joined(doc: Any, seqs: list[Sequence]) -> bytes:
        out = dict(doc)
        choices = []
        for seq in seqs:
            choice = dict(seq.item)
            choice["token_ids"] = seq.tokens
            if isinstance(choice.get("logprobs"), dict) and "content" in seq.lists:
                choice["logprobs"] = {**choice["logprobs"], "content": seq.lists["content"]}
            choice["finish_reason"] = seq.last.get("finish_reason")
            choice["stop_reason"] = seq.last.get("stop_reason")
            choice["weight_versions"] = seq.spans
            choices.append(choice)
        out["choices"] = choices
        use = dict(out.get("usage") or {})
        prompt = int(use.get("prompt_tokens") or len(seqs[0].prompt))
        completion = sum(len(s.tokens) for s in seqs)
        use.update(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        )
        out["usage"] = use
        return orjson.dumps(out)


def _meta(item: dict[str, Any]) -> dict[str, Any]:
    meta = item.get("meta_info")
    return meta if isinstance(meta, dict) else {}


def _lists(meta: dict[str, Any]) -> dict[str, Any]:
    """SGLang's per-output-token lists of ``meta_info`` (``output_token_logprobs`` ...)."""
    return {k: v for k, v in meta.items() if k.startswith("output_") and isinstance(v, list)}


def _content(choice: dict[str, Any]) -> dict[str, Any]:
    block = choice.get("logprobs")
    if isinstance(block, dict) and isinstance(block.get("content"), list):
        return {"content": block["content"]}
    return {}
