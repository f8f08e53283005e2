"""The phases of a request (docs/design.md, "Phases").

One vocabulary for every layer: the dispatch core waits in ``QUEUED`` (for engine
capacity or a weight-update pause), and the connection pool moves one attempt
through the other four. The enum lives here, beside ``errors`` and the settings,
rather than in ``trioforward.http``, because queueing for an engine is the dispatch
layer's idea: the pool never reports ``QUEUED`` (tests/test_layers.py holds it to
that). It imports nothing, so both layers can use it without importing each other.
"""

from __future__ import annotations

import enum

__all__ = ["Phase"]


class Phase(enum.Enum):
    """Where a request was when it failed (docs/design.md, "Phases")."""

    QUEUED = "queued"  # dispatch: waiting for engine capacity or a weight-update pause
    CONNECT = "connect"  # pool: opening TCP; no request byte sent
    SEND = "send"  # pool: writing the request; set *before* the first byte is written
    AWAIT_HEADERS = "await_headers"  # pool: request written, no response byte yet
    READ_BODY = "read_body"  # pool: response headers received, body arriving

    def __str__(self) -> str:
        return self.value
