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
from trioforward.dispatch.rollout._continue import derived, is_length_refusal, warn_no_token_ids
from trioforward.dispatch.rollout._continuing import (
    continue_each,
    count_continuation,
    send_continuation,
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
    try:
        body = orjson.loads(req.content)
        doc = orjson.loads(reply.content)
    except orjson.JSONDecodeError:
        return None
    seqs = route.sequences(body, doc, req.weight_version) if isinstance(body, dict) else None
    if seqs is None:
        warn_no_token_ids(counts, reply.engine.url)
        counts.whole += 1
        return None
    aborted = [s for s in seqs if route.aborted(s)]
    if not any(s.tokens for s in aborted):
        counts.whole += 1
        return None
    counts.answers += 1
    counts.tokens_kept += sum(len(s.tokens) for s in aborted)
    refused = await continue_each(
        aborted, lambda seq, failure: _continue(dispatcher, req, route, body, seq, failure)
    )
    if refused is not None:
        return refused
    content = route.joined(doc, seqs)
    return Reply(reply.engine, reply.status, reply.headers, content, None, reply.deadline)


async def _continue(
    dispatcher: Dispatcher,
    req: Request,
    route: Any,
    body: dict[str, Any],
    seq: Sequence,
    failure: list[Reply],
) -> None:
    counts = dispatcher.continued
    path = req.url_path
    while True:
        left = seq.left()
        if isinstance(left, int) and left <= 0:
            route.end_length(seq)
            return
        count_continuation(dispatcher, req, seq)
        sub_body = route.body(body, seq, left)
        sub = derived(req, orjson.dumps(sub_body))
        sub.only = req.only
        if path == SGLANG:
            sub.render = lambda engine, engine_id, b=sub_body: (
                path,
                orjson.dumps({**b, "rid": engine_id}),
            )
        answer = await send_continuation(dispatcher, req, sub, seq)
        if answer is None:
            continue  # ended by a pause before any token came back: send it again
        if is_length_refusal(answer.status, answer.content):
            route.end_length(seq)  # prompt + tokens so far no longer fit the model
            return
        if not 200 <= answer.status < 300:
            failure.append(answer)
            return
        try:
            got = route.read(answer.content)
        except orjson.JSONDecodeError:
            got = None
        if got is None:
            warn_no_token_ids(counts, answer.engine.url)
            failure.append(answer)
            return
        item, _ = got
        before = len(seq.tokens)
        route.add(seq, item, sub.weight_version)
        if not route.aborted(seq):
            return
        if sub.replay is False:
            raise req.stamp(sub.aborted())  # a pause without replay ended it
        if sub.replay is None:
            return  # an abort answer of another cause: the caller's
        counts.tokens_kept += len(seq.tokens) - before
