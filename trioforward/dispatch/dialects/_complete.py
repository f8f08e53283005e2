"""The typed completion call behind ``Client.complete`` and ``Client.sample``
(docs/embedding.md): the :class:`~trioforward.dispatch.dialects._dialect.TokenRequest` it
makes, rendered per attempt in the dialect of the engine it goes to
(docs/dispatch.md, "Engine dialects"), and the
:class:`~trioforward.codec.Completion` it makes of the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trioforward import Phase
from trioforward.codec import Completion, decode_completion
from trioforward.dispatch.attempts._types import ForwardResponse
from trioforward.dispatch.dialects import _dialect_completions
from trioforward.dispatch.dialects._dialect import Dialect, TokenRequest, dialect_for
from trioforward.dispatch.engines._engines import Engine
from trioforward.errors import EngineRejected

__all__ = ["complete_call", "completion_of", "Rendering"]

# complete() sets these itself: a stream would not decode, and without token ids
# every choice's token array would be empty.
_UNDECODABLE = frozenset({"stream", "return_token_ids"})


def complete_call(
    *,
    model: str,
    prompt: Sequence[int] | Any,
    max_tokens: int,
    n: int,
    temperature: float,
    seed: int | None,
    logprobs: bool,
    stop: str | list[str] | None,
    stop_token_ids: list[int] | None,
    prompt_logprobs: int | None,
    extra: dict[str, Any],
) -> tuple[TokenRequest, dict[str, Any]]:
    """``Client.complete``'s arguments as a :class:`TokenRequest` and its
    ``/v1/completions`` JSON body (always ``return_token_ids``; ``logprobs: 1`` when
    ``logprobs``; optional fields only when given; ``extra`` last). Raises
    ``ValueError`` for ``stream`` or ``return_token_ids`` in ``extra``."""
    if wrong := _UNDECODABLE.intersection(extra):
        raise ValueError(
            f"complete() sets {', '.join(sorted(wrong))} itself; use client.stream() or client.post()"
        )
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "n": n,
        "temperature": temperature,
        "return_token_ids": True,
    }
    optional: dict[str, Any] = {"logprobs": 1 if logprobs else None, "seed": seed, "stop": stop}
    optional.update(stop_token_ids=stop_token_ids, prompt_logprobs=prompt_logprobs)
    body.update((k, v) for k, v in optional.items() if v is not None)
    body.update(extra)
    request = TokenRequest(
        model=model,
        prompt=[int(t) for t in prompt],
        max_tokens=max_tokens,
        n=n,
        temperature=temperature,
        seed=seed,
        stop=[stop] if isinstance(stop, str) else stop,
        stop_token_ids=stop_token_ids,
        logprobs=logprobs,
        prompt_logprobs=bool(prompt_logprobs),
        extra=dict(extra),
    )
    return request, body


class Rendering:
    """The per-attempt body of one token-level request (``Request.render``): the
    dialect of the engine the attempt goes to, with the attempt's engine-side id;
    ``completions``: the ``/v1/completions`` body bytes when already made (sent
    as they are to engines of that dialect). ``dialect``: the last one used."""

    __slots__ = ("request", "completions", "dialect", "engine_id")

    def __init__(self, request: TokenRequest, completions: bytes | None = None) -> None:
        self.request = request
        self.completions = completions
        self.dialect: Dialect = _dialect_completions
        self.engine_id: str | None = None

    def __call__(self, engine: Engine, engine_id: str) -> tuple[str, bytes]:
        dialect = self.dialect = dialect_for(engine)
        if dialect is _dialect_completions and self.completions is not None:
            return _dialect_completions.PATH, self.completions
        self.engine_id = engine_id
        return dialect.render(self.request, engine_id)

    def parse(self, content: bytes, weight_version: str | None = None) -> Completion:
        return self.dialect.parse(content, self.request, weight_version)


def completion_of(
    response: ForwardResponse, parse: Callable[[bytes, str | None], Completion] | None = None
) -> Completion:
    """The :class:`Completion` of an engine answer to a token-level request, with
    the dispatch's engine, attempts and times. Raises :class:`EngineRejected` for
    a non-2xx answer and :class:`~trioforward.codec.CodecError` for a body that is
    not a completion or has no ``token_ids``."""
    if not 200 <= response.status < 300:
        text = response.content[:500].decode("utf-8", "replace")
        err = EngineRejected(
            f"engine {response.engine} answered {response.status}: {text}",
            status=response.status,
            body=response.content,
            headers=response.headers,
            # An engine status arrives at the end of AWAIT_HEADERS (as for the
            # rejection retries): the attempt got that far, no further.
            phase=Phase.AWAIT_HEADERS,
            attempts=response.attempts,
            engine=response.engine,
        )
        err.queue_time = response.queue_time
        err.engine_time = response.engine_time
        err.request_id = response.request_id
        raise err
    if parse is None:
        completion = decode_completion(
            response.content, require_token_ids=True, weight_version=response.weight_version
        )
    else:
        completion = parse(response.content, response.weight_version)
    completion.engine = response.engine
    completion.attempts = response.attempts
    completion.queue_time = response.queue_time
    completion.engine_time = response.engine_time
    completion.request_id = response.request_id
    completion.staleness = response.staleness
    completion.admission_time = response.admission_time
    return completion
