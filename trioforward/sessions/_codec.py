"""A session as bytes, for a state store shared by a fleet (docs/sessions.md,
"Fleet mode"): orjson, token ids and logprobs as JSON lists (numpy
serialization, ``OPT_SERIALIZE_NUMPY``); ``decode(encode(s))`` equals ``s``."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from trioforward.sessions._store import Session, Turn

__all__ = ["encode", "decode"]

_ARRAYS = {"prompt_ids": np.int32, "token_ids": np.int32, "logprobs": np.float32}
_FIELDS = (
    "new_start", "branch", "branch_reason", "weight_versions", "started", "finished",
    "engine", "finish_reason", "reward", "queue_time", "engine_time",
)  # fmt: skip


def encode(session: Session) -> bytes:
    """The session's bytes (its ``busy`` flag is not kept: a claim in the store is)."""
    turns = [
        {**{k: getattr(t, k) for k in _ARRAYS}, **{k: getattr(t, k) for k in _FIELDS}}
        for t in session.turns
    ]
    doc = {
        "id": session.id, "tenant": session.tenant, "created": session.created,
        "last_used": session.last_used, "messages": session.messages, "tools": session.tools,
        "rewards": session.rewards, "turns": turns,
    }  # fmt: skip
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def decode(data: bytes) -> Session:
    """The session :func:`encode` wrote."""
    doc: dict[str, Any] = orjson.loads(data)
    session = Session(doc["id"], doc["tenant"], doc["created"], doc["last_used"])
    session.messages, session.tools, session.rewards = doc["messages"], doc["tools"], doc["rewards"]
    for t in doc["turns"]:
        fields: dict[str, Any] = {k: np.asarray(t[k], dtype=dtype) for k, dtype in _ARRAYS.items()}
        fields.update((k, t[k]) for k in _FIELDS)
        session.turns.append(Turn(**fields))
    return session
