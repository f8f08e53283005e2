"""Fault switches of the simulated engine, settable at run time.

Set attributes on ``engine.faults`` (in process) or ``POST /sim/faults`` with a
JSON object of the same names (``{"reset": true}`` first clears every fault).
Count-style faults (``drop``, ``reject``, ``stall_headers``, ``stall_body``,
``trickle``, ``cut``) apply to the next K requests whose path is in ``paths`` (by default
the two generation endpoints, so health probes and adapter loads do not consume
them); each use decrements the count and bumps ``stats.faults[name]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Faults", "FaultError", "GENERATION_PATHS"]

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


class FaultError(ValueError):
    """A ``POST /sim/faults`` body names an unknown fault or gives a bad value."""


@dataclass(eq=False)
class Faults:
    """Every switch; all off by default.

    Connection level:

    - ``refuse_connections``: accept, then reset at once (RST via SO_LINGER 0).
      For a true "connection refused" use ``await engine.stop_listening()``.
    - ``pause_accept``: stop calling ``accept()``; connections complete the TCP
      handshake into the kernel backlog and wait there, unanswered.
    - ``connection_close``: send ``Connection: close`` on every response and close.
    - ``close_every``: close a connection after its Nth response (0 = never).

    Per request (the next K requests on ``paths``):

    - ``drop``: read the request, then close without answering a byte.
    - ``reject``: answer ``reject_status`` (503) with an OpenAI error body, plus
      ``Retry-After: <retry_after>`` when set; no generation is run.
    - ``stall_headers``: generate, send the status line and headers, then
      send nothing for ``stall_seconds`` (inf = until the client leaves).
    - ``stall_body``: generate, send headers and half the body (or the first
      half of the first stream chunk), then stall likewise.
    - ``trickle``: send the body ``trickle_bytes`` at a time every
      ``trickle_interval`` seconds.
    - ``cut``: the engine dies mid-answer. A stream sends ``cut_events``
      complete SSE events, then the first ``cut_bytes`` bytes of the next one,
      then closes the connection (no chunked terminator); a whole answer sends
      its headers and the first ``cut_bytes`` bytes of its body, then closes.

    Other: ``health_status``: the status ``GET /health`` answers (200);
    ``fail_weight_push``: the next K weight pushes fail (``_weight_push.py``).
    """

    refuse_connections: bool = False
    pause_accept: bool = False
    connection_close: bool = False
    close_every: int = 0
    drop: int = 0
    reject: int = 0
    reject_status: int = 503
    retry_after: float | None = None
    stall_headers: int = 0
    stall_body: int = 0
    stall_seconds: float = math.inf
    trickle: int = 0
    trickle_bytes: int = 16
    trickle_interval: float = 0.01
    cut: int = 0
    cut_events: int = 1
    cut_bytes: int = 60
    health_status: int = 200
    fail_weight_push: int = 0
    paths: tuple[str, ...] = field(default=GENERATION_PATHS)

    def __post_init__(self) -> None:
        self._watchers: list[Callable[[], None]] = []

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        for watcher in getattr(self, "_watchers", ()):
            watcher()

    def on_change(self, watcher: Callable[[], None]) -> None:
        """Call ``watcher()`` after every attribute change (the engine's accept loop uses it)."""
        self._watchers.append(watcher)

    def clear(self) -> None:
        """Switch every fault off (back to the defaults)."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, Faults.__dataclass_fields__[f.name].default)

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a ``POST /sim/faults`` body; ``"reset": true`` clears first.

        ``stall_seconds: null`` means forever. Raises :class:`FaultError`.
        """
        changes = dict(changes)
        if changes.pop("reset", False):
            self.clear()
        names = {f.name: f for f in dataclasses.fields(self)}
        for key, value in changes.items():
            if key not in names:
                raise FaultError(f"unknown fault {key!r}")
            current = getattr(self, key)
            if key == "stall_seconds" and value is None:
                value = math.inf
            elif key == "paths":
                if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                    raise FaultError("paths must be a list of strings")
                value = tuple(value)
            elif key == "retry_after":
                if value is not None and not isinstance(value, (int, float)):
                    raise FaultError("retry_after must be a number or null")
            elif isinstance(current, bool):
                if not isinstance(value, bool):
                    raise FaultError(f"{key} must be a boolean")
            elif isinstance(current, int):
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise FaultError(f"{key} must be a non-negative integer")
            elif isinstance(current, float):
                if not isinstance(value, (int, float)) or value < 0:
                    raise FaultError(f"{key} must be a non-negative number")
                value = float(value)
            setattr(self, key, value)

    def take(self, name: str) -> bool:
        """Consume one use of count fault ``name``; True if it applies now."""
        left: int = getattr(self, name)
        if left > 0:
            setattr(self, name, left - 1)
            return True
        return False

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy (``stall_seconds`` inf → null)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if math.isinf(out["stall_seconds"]):
            out["stall_seconds"] = None
        out["paths"] = list(out["paths"])
        return out
