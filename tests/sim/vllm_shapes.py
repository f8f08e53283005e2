"""Reduce an engine answer to what must match vLLM's, whatever the model says.

:func:`answer_outline` keeps the status, the content type, every field name and
its nesting, the JSON type of each value (not the value), the exact error
``type``/``param``/``code`` and message, the exact plain-text bodies
(load/unload), and for a stream the layout of its chunks per choice. Ids,
times, texts, token ids, logprobs and counts are model-dependent and reduced
to their types.
"""

from __future__ import annotations

import json
from typing import Any

# Objects whose keys are data (token texts or token ids), not field names.
_DATA_KEYED = ("choices[].logprobs.top_logprobs[]", "choices[].prompt_logprobs[]", "prompt_logprobs[]")


def shape(value: Any, path: str = "") -> Any:
    """``value`` with every leaf replaced by its JSON type and list runs collapsed."""
    if isinstance(value, dict):
        if path in _DATA_KEYED:
            # prompt_logprobs is keyed by token id; top_logprobs by token text (any string)
            ids = "prompt_logprobs" in path
            kinds = sorted({"id" if k.isdigit() or not ids else "text" for k in value})
            values: list[Any] = []
            for v in value.values():
                if shape(v) not in values:
                    values.append(shape(v))
            return {"<keys>": kinds, "<values>": values}
        return {k: shape(v, f"{path}.{k}" if path else k) for k, v in value.items()}
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            s = shape(item, path + "[]")
            merged = _unify(out[-1], s) if out else _CLASH
            if merged is _CLASH:
                out.append(s)
            else:
                out[-1] = merged
        return out
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    return "str"


_CLASH = object()


def _unify(a: Any, b: Any) -> Any:
    """One shape for two that are equal up to empty lists (a token whose text is
    a partial UTF-8 character has ``bytes: []``); ``_CLASH`` if they differ."""
    if a == b:
        return a
    if isinstance(a, list) and isinstance(b, list):
        if not a or not b:
            return a or b
        if len(a) == len(b):
            items = [_unify(x, y) for x, y in zip(a, b, strict=True)]
            return _CLASH if any(i is _CLASH for i in items) else items
        return _CLASH
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        out = {k: _unify(a[k], b[k]) for k in a}
        return _CLASH if any(v is _CLASH for v in out.values()) else out
    return _CLASH


def same_outline(a: Any, b: Any) -> bool:
    """True if two outlines are equal, an empty list matching any list."""
    return _unify(a, b) is not _CLASH


def _json_outline(body: Any) -> Any:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        return {"error": {k: error[k] for k in sorted(error)}}  # every value exact
    if isinstance(body, str):
        return body  # load/unload/health: plain text, exact
    return shape(body)


def _events(raw: str) -> list[Any]:
    out: list[Any] = []
    for block in raw.split("\n\n"):
        block = block.strip()
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_layout(raw: str) -> list[Any]:
    """The chunks of an SSE body: role chunks, then each choice's chunk shapes
    (consecutive repeats collapsed), then the usage chunk and ``[DONE]``."""
    roles: list[Any] = []
    per_choice: dict[int, list[Any]] = {}
    tail: list[Any] = []
    for event in _events(raw):
        if event == "[DONE]":
            tail.append(event)
            continue
        s = shape(event)
        if not event["choices"]:
            tail.append(s)
        elif "role" in event["choices"][0].get("delta", {}):
            roles.append(s)
        else:
            runs = per_choice.setdefault(event["choices"][0]["index"], [])
            if not runs or runs[-1] != s:
                runs.append(s)
    return [roles, [per_choice[i] for i in sorted(per_choice)], tail]


def answer_outline(status: int, content_type: str | None, body: Any, stream: bool) -> dict[str, Any]:
    """What of an answer must match: ``body`` is parsed JSON, a text, or a raw SSE body."""
    outline: dict[str, Any] = {"status": status, "content_type": content_type}
    outline["body"] = stream_layout(body) if stream else _json_outline(body)
    return outline


def load_fixture(fixtures: Any, name: str) -> dict[str, Any]:
    """A recorded answer's outline: ``NAME.json`` or the stream ``NAME.txt``."""
    path = fixtures / f"{name}.json"
    if path.exists():
        data = json.loads(path.read_text())
        return answer_outline(data["status"], data["content_type"], data["body"], False)
    text = (fixtures / f"{name}.txt").read_text()
    head, _, body = text.partition("\n\n")
    status_line, headers_line = head.split("\n", 1)
    try:
        headers = json.loads(headers_line)
    except json.JSONDecodeError:  # the first recordings wrote a Python dict
        headers = json.loads(headers_line.replace("'", '"'))
    status = int(status_line.split()[1])
    if status != 200:  # an error answers JSON, not a stream
        return answer_outline(status, headers.get("content-type"), json.loads(body), False)
    return answer_outline(status, headers.get("content-type"), body, True)
