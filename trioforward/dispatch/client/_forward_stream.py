"""``async with client.stream(...) as fs``: a forwarded response read as it arrives."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import trio

from trioforward import Phase
from trioforward.dispatch.attempts._outcome import Reply, gateway_error
from trioforward.dispatch.attempts._request import Request, strip_response_headers
from trioforward.dispatch.dialects._abort_answers import abort_tail
from trioforward.dispatch.dialects._routes import CONTINUED
from trioforward.dispatch.rollout._continue_stream import continuing_events
from trioforward.dispatch.rollout._pause_args import version_label
from trioforward.dispatch.rollout._staleness import ended_on
from trioforward.http import PoolError

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["ForwardStream"]


class ForwardStream:
    """A streamed engine answer (SSE for ``"stream": true``).

    ``status``/``headers`` (hop-by-hop removed) are the engine's; ``engine`` is
    its URL; ``attempts``, ``queue_time`` (s) and ``request_id`` as for ``ForwardResponse``
    (``attempts`` counts a continuation's too once the body is read);
    ``weight_version`` is the version at dispatch (the head's ``X-Weight-Version``)
    and :attr:`final_version` the answer's, known once the body is read.
    Retries happen only before the headers: once this object exists the answer
    is committed. A failure while reading raises :class:`UpstreamBroken` or
    :class:`DispatchTimeout` with phase ``READ_BODY`` (never retried; the
    connection is closed so the engine aborts). An error status (>= 400) comes
    with its whole body already read; ``aiter_bytes`` yields it.
    """

    __slots__ = (
        "status",
        "headers",
        "engine",
        "queue_time",
        "retries",
        "weight_version",
        "request_id",
        "admission_time",
        "cut",
        "_staleness",
        "_req",
        "_reply",
        "_dispatcher",
    )

    def __init__(
        self,
        req: Request,
        reply: Reply | None,
        dispatcher: Dispatcher | None = None,
        staleness: Callable[[Request], int | None] | None = None,
    ) -> None:
        """``reply`` ``None``: ``req`` was aborted by an abort call before any engine
        answered: a 200 SSE stream that is only the abort tail (docs/operations.md,
        "Over-sampling: cancelling a round's stragglers")."""
        if reply is None:
            self.status = 200
            self.headers = [(b"content-type", b"text/event-stream")]
            self.engine = req.engine_url or ""
        else:
            self.status = reply.status
            self.headers = strip_response_headers(reply.headers)
            self.engine = reply.engine.url
        self.queue_time = req.queue_time
        self.retries = tuple(req.retries) if req.retries else ()
        self.weight_version = req.weight_version  # at dispatch (docs/operations.md)
        self.request_id = req.request_id  # docs/server.md, "Request ids and rollout groups"
        self.admission_time = req.admission_time  # s at a staleness bound (docs/operations.md)
        self._staleness = staleness
        self._req = req
        self._reply = reply
        self._dispatcher = dispatcher  # continues an OpenAI stream (docs/operations.md)
        # True once an abort call cut the stream: the next chunk is the abort tail,
        # and an event the chunks before it left unfinished is to be dropped.
        self.cut = False

    @property
    def attempts(self) -> int:
        """Engine attempts so far, a continuation's included (docs/operations.md)."""
        return self._req.attempts

    @property
    def final_version(self) -> str | None:
        """``X-Weight-Version`` of the whole answer, as for a non-streamed one: the
        dispatch version, or both (``"v1, v2"``) when a weight update came while it
        ran (a keep pause spanned it, or an abort pause continued it). Read once
        the body has been read."""
        if self._dispatcher is None:
            return self.weight_version
        current = self._dispatcher.weight_version
        engine = None if self._reply is None else self._reply.engine
        return version_label(self.weight_version, ended_on(engine, current))

    @property
    def staleness(self) -> int | None:
        """Versions the weights it ended on are behind the current ones (read once
        the body has been read; ``None`` before any version was recorded)."""
        return None if self._staleness is None else self._staleness(self._req)

    @property
    def engine_time(self) -> float:
        """Seconds since dispatch (so far, while the body is still arriving)."""
        return self._req.engine_time_now()

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it arrives, in pieces of up to 64 KiB (a stream of a route that
        continues — ``/v1/completions``, ``/v1/chat/completions``, ``/generate``,
        ``/inference/v1/generate`` —: whole events, continued across an abort pause
        with ``replay="continue"``, docs/operations.md). A stream an abort call cut ends
        with the abort tail (:func:`abort_tail`), not an error."""
        req, reply = self._req, self._reply
        if reply is None:
            yield abort_tail(req.url_path, req.content, req.request_id)
            return
        if self._dispatcher is None or req.url_path not in CONTINUED or reply.body is None:
            async for chunk in self._raw():
                yield chunk
        else:
            async for chunk in continuing_events(self._dispatcher, req, reply, self._raw()):
                yield chunk
        if self.cut:
            yield abort_tail(req.url_path, req.content, req.request_id)

    async def _raw(self) -> AsyncIterator[bytes]:
        reply = self._reply
        req = self._req
        assert reply is not None
        if reply.body is None:
            if reply.content:
                yield reply.content
            return
        try:
            async for chunk in reply.body.aiter_bytes():
                yield chunk
        except PoolError as exc:
            if req.aborted_by_call:
                # Cut by an abort call (_abort.py): aiter_bytes ends it with the
                # abort tail. The bytes of an event left unfinished before the tail
                # are the reader's to drop (``cut``).
                self.cut = True
                return
            req.phase = Phase.READ_BODY
            error = gateway_error(exc, self.engine, reply.deadline, trio.current_time())
            raise req.stamp(error) from exc

    async def aread(self) -> bytes:
        """The rest of the body as one ``bytes``."""
        return b"".join([chunk async for chunk in self.aiter_bytes()])
