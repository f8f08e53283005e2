"""``create_app()``: the gateway as a Quart-Trio app (docs/server.md).

Lifetimes: at startup (``before_serving``) a task in the app's lifespan nursery
opens the dispatch client and a server-lifetime nursery, publishes them as a
:class:`GatewayState` in ``app.extensions["trioforward"]`` and waits; at shutdown
(``after_serving``, which Hypercorn runs only after in-flight requests drained or
``shutdown_grace`` passed) it cancels the background nursery and closes the
client. Both are therefore ``async with`` blocks, never closed by hand.

The app is the Quart app wrapped once, by the ASGI front (``_asgi.py``), which
answers the hot routes — OpenAI's (``_forward.py``) and Tinker's ``asample`` and
``retrieve_future`` (``tinker/_fastpath.py``) — before Quart sees them. The other
routes are Quart views: ``_routes.py`` (with ``_admin_routes.py``) and the Tinker blueprint
(``trioforward.server.tinker.install(app)``). :func:`create_app` is the one
place the wrapping is done.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from trioforward import Settings, SettingsError
from trioforward.dispatch import TenantTable, bad_id_reason
from trioforward.server.admin._abort import abort_here
from trioforward.server.admin._admin_log import install_admin_log
from trioforward.server.base._errors import RequestError, error_body
from trioforward.server.base._state import STATE_KEY, GatewayState
from trioforward.server.front._asgi import Front
from trioforward.server.front._auth import check_auth
from trioforward.server.proxy._forward import ROUTES as OPENAI_ROUTES
from trioforward.server.proxy._native import ROUTES as TOKEN_ROUTES
from trioforward.server.proxy._native_abort import ROUTES as TOKEN_ABORT_ROUTES
from trioforward.server.telemetry._metrics import Metrics
from trioforward.server.telemetry._tracing import install_admin_spans, open_tracing

__all__ = ["create_app", "CONFIG_ENV"]

# With no settings given, create_app() reads this TOML file (then TRIOFORWARD_* env).
CONFIG_ENV = "TRIOFORWARD_CONFIG"

log = logging.getLogger("trioforward.server")


def create_app(settings: Settings | None = None) -> QuartTrio:
    """The gateway app. ``settings=None``: :meth:`Settings.load` from the file named by
    ``$TRIOFORWARD_CONFIG`` (if set) and ``TRIOFORWARD_*`` variables.

    With ``settings`` given, a bad knob raised :class:`~trioforward.SettingsError`
    when they were built. Without, this is an ASGI server's command-line entry
    (``hypercorn -k trio "trioforward.server:create_app()"``): a bad knob, TOML file
    or missing file prints one line, ``Error: setting 'engine_capacity': ...
    (TRIOFORWARD_ENGINE_CAPACITY)``, on stderr and raises ``SystemExit(2)`` — any other
    exception would be a traceback in Hypercorn's worker process (docs/server.md,
    "Under the hypercorn command"). The app serves once started by an ASGI server
    with the trio worker.
    """
    from_environment = settings is None
    if settings is None:
        settings = _settings_from_environment()
    _configure_logging(settings)
    if from_environment and settings.workers > 1:
        log.warning(
            "workers = %d is ignored here: it is `trioforward serve`'s own supervisor; "
            "Hypercorn's --workers N starts N separate gateways "
            '(docs/server.md, "Under the hypercorn command")',
            settings.workers,
        )

    app = QuartTrio("trioforward.server")
    # docs/server.md, "Hypercorn and Quart settings the gateway makes": a burst gateway must not cut long generations or big batches.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_size
    app.config["BODY_TIMEOUT"] = None
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["JSON_SORT_KEYS"] = False
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.config["TRIOFORWARD_SETTINGS"] = settings  # what the app was built with

    metrics = Metrics(lambda: _client_or_none(app), lambda: _fleet_or_none(app))
    _install_lifespan(app, settings, metrics)
    _install_hooks(app, settings)

    from trioforward.server.app._routes import install_routes

    install_routes(app)
    from trioforward.server import tinker

    tinker.install(app)

    # The one ASGI wrapper: the hot routes are answered here, everything else by Quart.
    front = Front(app, app.asgi_app, {**OPENAI_ROUTES, **TOKEN_ROUTES, **TOKEN_ABORT_ROUTES, **tinker.FRONT_ROUTES})
    app.asgi_app = front  # type: ignore[method-assign,assignment]
    return app


def _settings_from_environment() -> Settings:
    from trioforward.server.app._cli import explain_bad_settings

    config_file = os.environ.get(CONFIG_ENV) or None
    try:
        return Settings.load(config_file=config_file)
    except (SettingsError, tomllib.TOMLDecodeError, OSError, TypeError) as exc:
        where = f"${CONFIG_ENV} {config_file}"
        print(f"Error: {explain_bad_settings(exc, where, flag=False)}", file=sys.stderr)
        raise SystemExit(2) from None


def _fleet_or_none(app: QuartTrio) -> Any:
    state: GatewayState | None = app.extensions.get(STATE_KEY)
    return None if state is None else state.fleet


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _configure_logging(settings: Settings) -> None:
    """The ``trioforward`` loggers at ``log_level``; with a stderr handler of
    ``trioforward serve``'s format when nothing else would print them — under the
    plain ``hypercorn`` command no root handler exists, and without one the access
    log and the engine ejection lines were dropped (docs/server.md, "Under the
    hypercorn command"). An application that configured logging keeps its own."""
    logger = logging.getLogger("trioforward")
    logger.setLevel(settings.log_level.upper())
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)


def _client_or_none(app: QuartTrio) -> Any:
    state: GatewayState | None = app.extensions.get(STATE_KEY)
    return None if state is None else state.client


def _install_lifespan(app: QuartTrio, settings: Settings, metrics: Metrics) -> None:
    stop = trio.Event()
    stopped = trio.Event()

    async def run_gateway(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from trioforward.dispatch import open_client

        try:
            async with (
                open_tracing(settings, metrics.spans_dropped) as tracing,
                open_client(
                    engines=list(settings.engines),
                    settings=settings,
                    tracer_provider=None if tracing is None else tracing.provider,
                ) as client,
                _open_fleet(client, settings) as fleet,
                trio.open_nursery() as nursery,
            ):
                app.extensions[STATE_KEY] = GatewayState(
                    settings=settings,
                    client=client,
                    nursery=nursery,
                    metrics=metrics,
                    fleet=fleet,
                    tracing=tracing,
                )
                if fleet is not None:  # an abort reaches this member's Tinker queue too
                    fleet.control.abort_hook = functools.partial(
                        abort_here, app.extensions[STATE_KEY]
                    )
                client.aborts.on_group_end = metrics.group_tail  # group tails (_metrics.py)
                nursery.start_soon(metrics.keep_synced)
                task_status.started()
                await stop.wait()
                # Background work (Tinker futures) ends with the server.
                nursery.cancel_scope.cancel()
        finally:
            app.extensions.pop(STATE_KEY, None)
            stopped.set()

    @app.before_serving
    async def _startup() -> None:
        try:
            await app.nursery.start(run_gateway)
        except BaseException:
            # Quart-Trio passes only str(error) on to the server: log the cause here.
            log.exception("gateway startup failed")
            raise
        # Registered engines: the settings may name one twice (http://h:1 and http://h:1/).
        state: GatewayState = app.extensions[STATE_KEY]
        count = len(state.client.engines.list())
        log.info("gateway serving %d engine(s)", count)
        if count == 0:
            log.warning(
                "no engine registered: every request answers 503 no_engine_available until "
                "one is given (--engine URL, or POST /admin/engines)"
            )

    @app.after_serving
    async def _shutdown() -> None:
        stop.set()
        await stopped.wait()


@asynccontextmanager
async def _open_fleet(client: Any, settings: Settings) -> AsyncIterator[Any]:
    """This process's fleet membership when ``state_url`` is set, else ``None``.
    Without ``state_url`` no Redis client is imported (docs/fleet.md)."""
    if settings.state_url is None:
        yield None
        return
    from trioforward.fleet import open_fleet

    async with open_fleet(client, settings) as fleet:
        yield fleet


def _install_hooks(app: QuartTrio, settings: Settings) -> None:
    install_admin_log(app)
    install_admin_spans(app, lambda: getattr(app.extensions.get(STATE_KEY), "tracing", None))
    tenants = TenantTable(settings)  # the keys: which tenant matters only on the front's routes

    @app.before_request
    async def _authenticate() -> Response | None:
        try:
            check_auth(settings, request.path, lambda name: request.headers.get(name), tenants)
        except RequestError as err:
            return json_response(err.body(), err.status)
        return None

    @app.after_request
    async def _request_id(response: Response) -> Response:
        # Every answer carries the request's id (docs/server.md, "Request ids and
        # rollout groups"), the Quart routes' included: the caller's when it is
        # one, else a fresh one. A bad one is not echoed (these routes ignore it).
        raw = request.headers.get("X-Request-Id")
        if raw is None:
            state = app.extensions.get(STATE_KEY)
            if state is not None:
                response.headers["X-Request-Id"] = state.client.new_request_id()
        elif bad_id_reason(raw) is None:
            response.headers["X-Request-Id"] = raw
        return response

    @app.errorhandler(RequestError)
    async def _request_error(err: RequestError) -> Response:
        response = json_response(err.body(), err.status)
        for name, value in err.headers():
            response.headers[name.decode("latin-1")] = value.decode("latin-1")
        return response

    @app.errorhandler(404)
    async def _not_found(_: Exception) -> Response:
        return json_response(error_body(f"no route {request.path}", code="not_found"), 404)

    @app.errorhandler(405)
    async def _not_allowed(err: Exception) -> Response:
        response = json_response(
            error_body(
                f"{request.method} not allowed on {request.path}", code="method_not_allowed"
            ),
            405,
        )
        allowed = getattr(err, "valid_methods", None)  # werkzeug's MethodNotAllowed
        if allowed:
            response.headers["Allow"] = ", ".join(sorted(allowed))  # RFC 9110 §15.5.6
        return response

    @app.errorhandler(413)
    async def _too_large(_: Exception) -> Response:
        message = f"request body larger than {settings.max_body_size} bytes"
        return json_response(error_body(message, code="request_too_large"), 413)

    @app.errorhandler(500)
    async def _internal(_: Exception) -> Response:
        return json_response(
            error_body("internal gateway error", type="server_error", code="internal_error"), 500
        )


def json_response(body: bytes, status: int = 200) -> Response:
    """A response with an already-encoded JSON body."""
    return Response(body, status=status, content_type="application/json")
