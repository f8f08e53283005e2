"""One ``weight_versions`` span on each choice's last event of a ``/v1/completions``
stream that crossed no update (docs/operations.md, "Weight versions").

A stream whose caller asked for ``return_token_ids`` gets, once a weight
version is recorded, ``weight_versions: [{"version", "start": 0, "end": n}]``
on the event that ends each choice (its ``finish_reason``), ``n`` the choice's
tokens over the whole stream, as a continued stream's last events have them.
Every event is read to count the tokens; only the ending events are written
again, the others go as the engine sent them. A choice ended by an abort, or a
stream the dispatcher's version moved under (a keep pause), gets none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._events import payload, split

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["StreamSpans"]


class StreamSpans:
    """Counts each choice's tokens and labels its ending event."""

    __slots__ = ("req", "dispatcher", "counts")

    def __init__(self, req: Request, dispatcher: Dispatcher) -> None:
        self.req = req
        self.dispatcher = dispatcher
        self.counts: dict[int, int] = {}

    @staticmethod
    def wanted(req: Request, dispatcher: Dispatcher) -> bool:
        """The caller asked for token ids itself and a version is recorded."""
        return (
            not req.asked_ids
            and req.weight_version is not None
            and req.weight_version == dispatcher.weight_version
            and b"return_token_ids" in req.content
        )

    def _counted(self, event: bytes) -> bool:
        """Count a mid-stream event of one choice without parsing it (vLLM sends one
        choice per event): its ``index`` and ``token_ids`` list read as bytes."""
        if event.count(b'"token_ids":') != 1 or not (
            b'"finish_reason":null' in event or b'"finish_reason": null' in event
        ):
            return False
        at = event.find(b'"index":')
        ids = event.find(b'"token_ids":')
        if at < 0 or event.find(b'"index":', at + 1) >= 0:
            return False
        start = event.find(b"[", ids)
        end = event.find(b"]", start)
        digits = event[at + 8 : at + 20].lstrip().split(b",", 1)[0].rstrip(b"} ")
        if start < 0 or end < 0 or not digits.isdigit() or event[ids + 12 : start].strip():
            return False
        inner = event[start + 1 : end]
        index = int(digits)
        self.counts[index] = self.counts.get(index, 0) + (
            inner.count(b",") + 1 if inner.strip() else 0
        )
        return True

    def block(self, block: bytes) -> bytes:
        """``block`` (whole events) with the ending events labelled."""
        out: list[bytes] = []
        changed = False
        version = self.req.weight_version
        # One event per block is the common case: no split.
        single = block.endswith(b"\n\n") and block.find(b"\n\n") == len(block) - 2
        for event in (block,) if single and b"\r" not in block else split(block):
            if self._counted(event):
                out.append(event)
                continue
            doc = payload(event)
            labelled = False
            if isinstance(doc, dict):
                for choice in doc.get("choices") or ():
                    if not isinstance(choice, dict) or not isinstance(
                        choice.get("token_ids"), list
                    ):
                        continue
                    index = choice.get("index", 0)
                    n = self.counts[index] = self.counts.get(index, 0) + len(choice["token_ids"])
                    finish = choice.get("finish_reason")
                    if (
                        finish is not None
                        and finish != "abort"
                        and "weight_versions" not in choice
                        and self.dispatcher.weight_version == version
                    ):
                        choice["weight_versions"] = [{"version": version, "start": 0, "end": n}]
                        labelled = True
            if labelled:
                event = b"data: " + orjson.dumps(doc) + b"\n\n"
                changed = True
            out.append(event)
        return b"".join(out) if changed else block
