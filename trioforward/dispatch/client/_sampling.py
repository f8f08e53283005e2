"""Token-level sampling on the client: ``complete``, ``sample`` and
``sample_response`` (docs/embedding.md; docs/dispatch.md, "Engine dialects").

:class:`Sampling` is a base of :class:`~trioforward.dispatch.Client`: a
token-level request is forwarded as :class:`Forwarding` forwards any request,
rendered per attempt in the dialect of the engine it goes to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from trioforward.codec import Completion
from trioforward.dispatch.attempts._request import HeaderInput
from trioforward.dispatch.attempts._types import ForwardResponse
from trioforward.dispatch.client._forwarding import Forwarding, Options
from trioforward.dispatch.dialects import _dialect_completions
from trioforward.dispatch.dialects._complete import (
    Rendering,
    complete_call,
    completion_of,
)
from trioforward.dispatch.dialects._dialect import TokenRequest
from trioforward.dispatch.engines._tenants import Tenant
from trioforward.dispatch.rollout._staleness import WeightPolicy

__all__ = ["Sampling"]


class Sampling(Forwarding):
    """The token-level sampling part of :class:`~trioforward.dispatch.Client`."""

    async def complete(
        self,
        *,
        model: str,
        prompt: Sequence[int] | Any,
        max_tokens: int,
        n: int = 1,
        temperature: float = 1.0,
        seed: int | None = None,
        logprobs: bool = True,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        prompt_logprobs: int | None = None,
        session: str | None = None,
        request_id: str | None = None,
        group: str | None = None,
        tenant: str | None = None,
        weight_policy: str | WeightPolicy | None = None,
        **extra: Any,
    ) -> Completion:
        """Sample ``n`` completions of token-id ``prompt`` (:meth:`sample`: ``POST
        /v1/completions``, or the engine's own token route, docs/dispatch.md,
        "Engine dialects").

        Returns a :class:`~trioforward.codec.Completion`: each choice's ``tokens`` is
        ``np.ndarray[int32]`` ``(len,)``, ``logprobs`` ``np.ndarray[float32]`` (or
        ``None`` when ``logprobs=False``); ``prompt_logprobs`` (when asked) is
        ``float32`` ``(len(prompt),)`` with NaN at position 0. Raises
        :class:`~trioforward.errors.EngineRejected` (``.status``, ``.body``) for a
        non-2xx answer, :class:`~trioforward.codec.CodecError` (a ``ValueError``)
        for a 2xx body that is not a completion or has no ``token_ids``, the
        dispatch errors of :meth:`post`, and ``ValueError`` for ``stream`` or
        ``return_token_ids`` in ``extra``. ``request_id`` and ``group`` as for
        :meth:`post`; the completion's ``.request_id`` is the request's id.
        ``weight_policy``: the weights it accepts, as for :meth:`post`.
        """
        request, body = complete_call(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            n=n,
            temperature=temperature,
            seed=seed,
            logprobs=logprobs,
            stop=stop,
            stop_token_ids=stop_token_ids,
            prompt_logprobs=prompt_logprobs,
            extra=extra,
        )
        content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
        return await self.sample(
            request,
            session=session,
            completions_body=content,
            request_id=request_id,
            group=group,
            tenant=tenant,
            weight_policy=weight_policy,
        )

    async def sample(
        self,
        request: TokenRequest,
        *,
        session: str | None = None,
        session_implied: bool = False,
        headers: HeaderInput = None,
        completions_body: bytes | None = None,
        request_id: str | None = None,
        group: str | None = None,
        tenant: str | Tenant | None = None,
        weight_policy: str | WeightPolicy | None = None,
    ) -> Completion:
        """Sample a token-level ``request`` on whichever engine routing picks, in
        that engine's dialect (docs/dispatch.md, "Engine dialects"): SGLang
        ``/generate``, vLLM ``/inference/v1/generate`` when served, else
        ``/v1/completions`` with ``return_token_ids`` (``completions_body``: that
        body already encoded, sent as is). Every attempt gets a fresh engine-side id.
        Returns and raises as :meth:`complete`; ``session``, ``session_implied``
        ``headers``, ``request_id``, ``group`` and ``tenant`` as for :meth:`post`. ``request.extra`` goes to
        ``/v1/completions`` engines only.
        """
        response, parse = await self.sample_response(
            request,
            session=session,
            session_implied=session_implied,
            headers=headers,
            completions_body=completions_body,
            request_id=request_id,
            group=group,
            tenant=tenant,
            weight_policy=weight_policy,
        )
        return completion_of(response, parse)

    async def sample_response(
        self,
        request: TokenRequest,
        *,
        session: str | None = None,
        session_implied: bool = False,
        headers: HeaderInput = None,
        completions_body: bytes | None = None,
        request_id: str | None = None,
        group: str | None = None,
        tenant: str | Tenant | None = None,
        weight_policy: str | WeightPolicy | None = None,
    ) -> tuple[ForwardResponse, Callable[[bytes, str | None], Completion]]:
        """As :meth:`sample`, but the engine's answer as it came, whatever its
        status, with the function that decodes a 2xx body of it (the dialect of
        the engine that answered; raises :class:`~trioforward.codec.CodecError`)."""
        request.adapter = self.adapters.is_adapter(request.model)
        if completions_body is None:
            completions_body = _dialect_completions.render(request, "")[1]
        rendering = Rendering(request, completions_body)
        json = {"model": request.model, "prompt": request.prompt}
        options = Options(json=json, content=completions_body, headers=headers, session=session)
        options.update(Options(request_id=request_id, group=group, tenant=tenant))
        options.update(Options(weight_policy=weight_policy))
        req = self._request("POST", _dialect_completions.PATH, options, session_implied)
        req.render = rendering
        return await self._answer(req), rendering.parse
