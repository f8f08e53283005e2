"""trioforward.sessions: agent sessions on the chat route (docs/sessions.md).

A session keeps the exact tokens each chat turn was prompted with and sampled;
a turn that extends the previous one is prompted with the previous prompt, the
sampled ids and only the new messages' tokens, never a re-render of what the
model produced. Its trajectory (token ids, logprobs, loss mask, weight-version
spans, timing, branch points) is readable as JSON or numpy arrays.
Used by the gateway's chat route (``X-Session-Id``) and embedded as
:class:`Sessions` over a dispatch client.
"""

from __future__ import annotations

from trioforward.sessions._render import EngineRenderer, LocalRenderer, Renderer
from trioforward.sessions._sessions import Sessions
from trioforward.sessions._store import Session, SessionError, SessionStore, Turn
from trioforward.sessions._stream import StreamedTurn
from trioforward.sessions._tools import TOOL_PARSERS
from trioforward.sessions._turn import session_servable

__all__ = [
    "Sessions",
    "Session",
    "SessionStore",
    "SessionError",
    "Turn",
    "Renderer",
    "EngineRenderer",
    "LocalRenderer",
    "session_servable",
    "StreamedTurn",
    "TOOL_PARSERS",
]
