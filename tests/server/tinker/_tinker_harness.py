"""Test helpers: serve a Quart-Trio app with Hypercorn on 127.0.0.1, and a scripted engine client.

:class:`ScriptedClient` stands in for the dispatch client where a test must
control *when* a sample finishes (abandoned polls, hold limits, eviction); it
answers like the simulated engine (``trioforward.sim`` generation functions),
so the tokens are the same deterministic ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

from trioforward._settings import Settings
from trioforward.dispatch import TenantTable
from trioforward.server.base._state import STATE_KEY, GatewayState


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` on an ephemeral port; yields its base URL; stops it on exit."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(
                app, config, shutdown_trigger=stop.wait, task_status=task_status
            )
        )
        try:
            yield binds[0].replace("0.0.0.0", "127.0.0.1")
        finally:
            stop.set()


@dataclass
class _Response:
    status: int
    content: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    weight_version: str | None = None


class _Adapters:
    def __init__(self) -> None:
        self.registered: dict[str, str] = {}

    def register(self, name: str, path: str) -> None:
        self.registered[name] = path

    def list(self) -> dict[str, str]:
        return dict(self.registered)

    def is_adapter(self, name: str) -> bool:
        return name in self.registered


class _Engines:
    def list(self) -> list[object]:
        return [object()]


class PostOnly:
    """``sample_response`` of a test client made of ``post()``: the ``/v1/completions``
    dialect (the job's ready body), decoded by the default decoder."""

    async def sample_response(self, tokens: Any, *, completions_body: bytes, **kw: Any) -> Any:
        answer = await self.post(  # type: ignore[attr-defined]
            "/v1/completions", content=completions_body, json={"model": tokens.model}, **kw
        )
        return answer, None


class ScriptedClient(PostOnly):
    """``post()`` answers like the simulated engine; ``gate`` (when set) holds every answer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tenants = TenantTable(settings)  # what the front resolves API keys with
        self.adapters = _Adapters()
        self.engines = _Engines()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[Any] = []
        self.gate: trio.Event | None = None
        self.status = 200
        self.finished = 0
        self.weight_version: str | None = None
        self.ids_made = 0

    def retry_after_hint(self, error: Any) -> int:
        return 1

    def new_request_id(self) -> str:
        self.ids_made += 1
        return f"scripted-{self.ids_made}"

    async def engine_models(self) -> list[dict[str, Any]]:
        return []

    async def post(
        self,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: Any = None,
        session: Any = None,
        session_implied: bool = False,
        request_id: str | None = None,
        group: str | None = None,
        tenant: Any = None,
    ) -> _Response:
        from trioforward.sim.model._generate import sample

        assert path == "/v1/completions"
        body = orjson.loads(content) if content is not None else json
        self.requests.append(body)
        self.headers.append(headers)
        if self.gate is not None:
            await self.gate.wait()
        self.finished += 1
        if self.status != 200:
            return _Response(self.status, orjson.dumps({"error": {"message": "scripted failure"}}))
        choices = []
        for i in range(body["n"]):
            s = sample(
                body["model"],
                body["prompt"],
                body.get("seed"),
                i,
                body.get("max_tokens", 16),
                body.get("stop_token_ids", ()),
                body.get("stop", ()),
            )
            choices.append(
                {
                    "index": i,
                    "text": s.text,
                    "token_ids": s.tokens,
                    "logprobs": {"token_logprobs": s.logprobs},
                    "finish_reason": s.finish_reason,
                }
            )
        return _Response(
            200, orjson.dumps({"id": "x", "model": body["model"], "choices": choices, "usage": {}})
        )


@contextlib.asynccontextmanager
async def scripted_gateway(**knobs: Any) -> AsyncIterator[tuple[str, ScriptedClient, GatewayState]]:
    """A minimal Quart-Trio app with only the Tinker routes (the Quart views and the
    ASGI front's, wrapped as ``create_app`` does) and a :class:`ScriptedClient`."""
    from trioforward.server.front._asgi import Front
    from trioforward.server.tinker import FRONT_ROUTES, install

    settings = Settings(**knobs)
    client = ScriptedClient(settings)
    app = QuartTrio("tinker-test")
    install(app)
    app.asgi_app = Front(app, app.asgi_app, FRONT_ROUTES)  # type: ignore[method-assign,assignment]
    async with trio.open_nursery() as background:
        state = GatewayState(settings=settings, client=client, nursery=background)  # type: ignore[arg-type]
        app.extensions[STATE_KEY] = state
        async with serving(app) as url:
            yield url, client, state
        background.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def real_gateway(*engine_urls: str, **knobs: Any) -> AsyncIterator[tuple[str, Any]]:
    """The full gateway (``create_app``: dispatch core, auth, every route) under Hypercorn."""
    from trioforward.server import create_app
    from trioforward.server import serve as serve_gateway

    settings = Settings(engines=tuple(engine_urls), shutdown_grace=2.0).replace(**knobs)
    app = create_app(settings)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_gateway(
                app,
                settings,
                bind="127.0.0.1:0",
                shutdown_trigger=stop.wait,
                task_status=task_status,
            )
        )
        try:
            yield binds[0], app
        finally:
            stop.set()


def sdk_sample(
    url: str,
    *,
    base_model: str | None = None,
    model_path: str | None = None,
    prompt: list[int],
    num_samples: int,
    api_key: str = "tml-dummy",
    include_prompt_logprobs: bool = False,
    **params: Any,
) -> Any:
    """Sample with the unmodified tinker SDK (blocking: run it in a thread)."""
    import tinker
    from tinker import types

    with tinker.ServiceClient(base_url=url, api_key=api_key) as service:
        client = service.create_sampling_client(
            base_model=base_model, model_path=model_path
        ).result()
        return client.sample(
            prompt=types.ModelInput.from_ints(prompt),
            num_samples=num_samples,
            sampling_params=types.SamplingParams(**params),
            include_prompt_logprobs=include_prompt_logprobs,
        ).result(timeout=60)
