"""Continue the engines' own token routes after an abort pause (docs/operations.md,
"Continue after an abort pause"; docs/server.md, "Token routes").

``POST /generate`` (SGLang) and ``POST /inference/v1/generate`` (vLLM 0.32) are
token routes already: the caller's prompt ids and the engine's output ids are
in the bodies. An answer an abort pause with ``replay="continue"`` ended (200,
each aborted sequence with its tokens so far) is not handed out: each aborted
sequence is sent again on its own, in the route's own body — the caller's body
with the prompt ids + the tokens so far (``input_ids`` / ``token_ids``), ``n``
1 and the budget left (``max_new_tokens`` / ``max_tokens``) — and the segments
are joined into the one answer of the route's own shape:

- SGLang: per item ``output_ids``, ``text`` and every ``meta_info.output_*``
  list joined (``output_token_logprobs`` ...), ``meta_info.finish_reason`` and
  ``weight_version`` the last segment's, ``completion_tokens`` every generated
  token, ``weight_versions`` spans over ``0..len(output_ids)``; one object or a
  list, as the first answer was; batches and ``n > 1`` by position
  (prompt-major, sample-minor);
- vLLM: per choice ``token_ids`` and ``logprobs.content`` joined,
  ``finish_reason``/``stop_reason`` the last segment's, ``weight_versions``
  spans; ``usage`` over every generated token.

The first answer's ids stay (the route puts the caller's back). Each segment is
one span under the version the gateway dispatched it under (the version
``POST /admin/resume`` recorded, as on every other route; the engines' own
labels may name something else, SGLang's ``"default"`` until told one).

The budget: the caller's, less what was generated. SGLang's default when the
caller gave none is 128 (``SamplingParams.max_new_tokens``), pinned; ``null``
(no limit but the context) stays ``null``. vLLM 0.32's token route, when the
caller gave no ``max_tokens``, computes it from the model length left by the
prompt (``serving.py``: ``get_max_tokens``), which for prompt + tokens so far
is exactly what was left: the continuation sends none either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from trioforward.dispatch.attempts._outcome import Reply
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.dialects._continue_shapes import (
    NATIVE_PATHS,
    SGLANG,
    Sequence,
    Sglang,
    Vllm,
)
from trioforward.dispatch.rollout._continue import derived, warn_no_token_ids
from trioforward.dispatch.rollout._continuing import (
    continue_aborted,
    continue_piece,
    loaded,
)

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._dispatch import Dispatcher

__all__ = ["NATIVE_PATHS", "continued_native"]


async def continued_native(dispatcher: Dispatcher, req: Request, reply: Reply) -> Reply | None:
    """The joined answer of a token-route request whose answer ``reply`` an abort
    pause ended, in that route's shape; ``None`` when it cannot be continued (a
    text prompt, an answer it cannot read, nothing generated yet): the caller
    replays it whole. Raises :class:`DispatchAborted` past ``max_continuations``
    and the dispatch errors of a continuation."""
    route = Sglang if req.url_path == SGLANG else Vllm
    counts = dispatcher.continued
    parsed = loaded(req, reply)
    if parsed is None:
        return None
    body, doc = parsed
    seqs = route.sequences(body, doc, req.weight_version) if isinstance(body, dict) else None
    if seqs is None:
        warn_no_token_ids(counts, reply.engine.url)
        counts.whole += 1
        return None
    return await continue_aborted(
        dispatcher,
        reply,
        [s for s in seqs if route.aborted(s)],
        lambda seq, failure: _continue(dispatcher, req, route, body, seq, failure),
        lambda: route.joined(doc, seqs),
    )


async def _continue(
    dispatcher: Dispatcher,
    req: Request,
    route: Any,
    body: dict[str, Any],
    seq: Sequence,
    failure: list[Reply],
) -> None:
    await continue_piece(dispatcher, req, seq, failure, _Native(req, route, body))


class _Native:
    """One token-route sequence continued (:class:`~._continuing.Step`), in ``route``'s
    shape (:class:`~trioforward.dispatch.dialects._continue_shapes.Sglang` or ``Vllm``)."""

    __slots__ = ("req", "route", "body")

    def __init__(self, req: Request, route: Any, body: dict[str, Any]) -> None:
        self.req, self.route, self.body = req, route, body

    def left(self, seq: Sequence) -> Any:
        return seq.left()

    def end_length(self, seq: Sequence) -> None:
        self.route.end_length(seq)

    def request(self, seq: Sequence, left: Any) -> Request:
        req, path = self.req, self.req.url_path
        sub_body = self.route.body(self.body, seq, left)
        sub = derived(req, orjson.dumps(sub_body))
        if path == SGLANG:
            sub.render = lambda engine, engine_id, b=sub_body: (
                path,
                orjson.dumps({**b, "rid": engine_id}),
            )
        return sub

    def read(self, answer: Reply, sub: Request) -> Any:
        try:
            got = self.route.read(answer.content)
        except orjson.JSONDecodeError:
            return None
        return None if got is None else got[0]

    def add(self, seq: Sequence, item: Any, version: str | None) -> bool:
        self.route.add(seq, item, version)
        return bool(self.route.aborted(seq))
