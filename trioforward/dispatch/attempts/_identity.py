"""A request's identity: its request id, the engine-side id of each attempt, its rollout group.

docs/server.md, "Request ids and rollout groups". Every request has a request id:
the caller's (``X-Request-Id``, or ``request_id=`` in the embedded client) or one
this module makes. Each attempt sends the engine a fresh *engine-side* id
derived from it (engines refuse or mix up an id they already run: vLLM aborts
every request of one external id at once, SGLang answers 400 ``Duplicate request
ID``), kept on the :class:`~trioforward.dispatch.attempts._request.Request` as
``engine_request_id`` for an abort to name. A request may belong to a rollout
group (``X-Rollout-Group``, ``group=``): the unit over-sampling cancels.

Both are printable ASCII without spaces (``!`` to ``~``), 1 to
:data:`MAX_ID_LENGTH` characters: they go into header values, log lines and
engine request ids as they are.
"""

from __future__ import annotations

import os

import orjson

__all__ = ["MAX_ID_LENGTH", "SGLANG_RID_PATHS", "IdMaker", "check_id", "bad_id_reason", "with_rid"]

#: Longest request id or rollout group (characters).
MAX_ID_LENGTH = 128
#: SGLang's OpenAI routes: they take the request id from the body's ``"rid"``
#: and ignore ``X-Request-Id`` (``srt/entrypoints/openai/protocol.py``, ``rid``;
#: ``serving_base.py``); the answer's ``id`` and ``/abort_request`` use it.
SGLANG_RID_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


def with_rid(body: bytes, rid: str | list[str]) -> bytes:
    """``body`` (a JSON object's bytes) with ``"rid": rid`` appended last, so it wins
    over a ``"rid"`` of the caller's (JSON parsers keep the last of a duplicate key);
    the rest goes byte for byte."""
    inner = body.rstrip()[:-1].rstrip()
    sep = b"" if inner.endswith(b"{") else b","
    return inner + sep + b'"rid":' + orjson.dumps(rid) + b"}"


def bad_id_reason(value: object) -> str | None:
    """Why ``value`` is not a request id / group (a short phrase), or ``None`` if it is one."""
    if not isinstance(value, str):
        return "must be a string"
    if not 0 < len(value) <= MAX_ID_LENGTH:
        return f"must be 1 to {MAX_ID_LENGTH} characters long (got {len(value)})"
    if not (value.isascii() and value.isprintable()) or " " in value:
        return "must be printable ASCII without spaces"
    return None


def check_id(value: object, name: str) -> str:
    """``value`` if it is a valid id, else ``ValueError`` naming ``name`` and why."""
    reason = bad_id_reason(value)
    if reason is not None:
        raise ValueError(f"{name} {reason}")
    assert isinstance(value, str)
    return value


class IdMaker:
    """Request ids and engine-side ids, unique to this process.

    ``tag``: 12 random hex digits chosen at creation, so two processes (fleet
    members, two trainers on one engine) never make the same request id; a
    counter makes the rest. The attempt counter starts at a random 40-bit
    value: two processes forwarding the same caller id reach an engine with
    different engine-side ids. O(1), no lock (trio: no checkpoint inside).
    """

    __slots__ = ("tag", "_requests", "_attempts")

    def __init__(self) -> None:
        self.tag = os.urandom(6).hex()
        self._requests = 0
        self._attempts = int.from_bytes(os.urandom(5), "big")

    def request_id(self) -> str:
        """A fresh request id: ``"<tag>-<n>"`` (n in hex)."""
        self._requests += 1
        return f"{self.tag}-{self._requests:x}"

    def engine_id(self, request_id: str) -> str:
        """A fresh engine-side id for one attempt of ``request_id``:
        ``"<request_id>.<n>"``, n counting every attempt of this process, 10 hex
        digits: ids of one request id never are prefixes of one another (SGLang's
        scheduler aborts every rid that starts with the one named)."""
        self._attempts += 1
        return f"{request_id}.{self._attempts:010x}"
