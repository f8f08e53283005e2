"""``trioforward serve``: the gateway under Hypercorn's trio worker.

Every knob of :mod:`trioforward._settings` is a ``--kebab-case`` flag generated
from :func:`~trioforward._settings.knobs` (so flags, environment names and docs
cannot drift). Precedence, lowest to highest: defaults, ``--config`` TOML file,
``TRIOFORWARD_<KNOB>`` environment, flags. A bad value exits with status 2 and a
message naming the knob.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import tomllib
from typing import Any

import click
import trio

from trioforward import RENAMED_KNOBS, Knob, Settings, SettingsError, knobs
from trioforward._words import count_of

__all__ = ["serve", "load_settings", "explain_bad_settings"]


def _describe(knob: Knob) -> str:
    default = knob.default
    if isinstance(default, (tuple, dict)) and not default:
        shown = "none"
    elif default is None:
        shown = "unset" if "unset" in knob.help or not knob.optional else "unlimited"
    else:
        shown = str(default)
    if knob.unit and isinstance(default, int) and not isinstance(default, bool):
        shown = count_of(default, knob.unit)  # "1 retry", "4 retries"
    elif knob.unit and knob.unit != "ratio" and isinstance(default, float):
        shown = f"{default} {knob.unit}"
    return f"{knob.help}  [default: {shown}; env {knob.env}]"


# What a flag's value is, where the knob's unit does not say (click's default is TEXT).
_METAVARS = {
    "engines": "URL,...",
    "api_keys": "KEY,...",
    "adapters": "NAME=PATH,...",
    "host": "ADDRESS",
    "port": "PORT",
    "routing": "POLICY",
    "engine_kind": "KIND",
    "engine_kinds": "URL=KIND,...",
    "log_level": "LEVEL",
    "admin_token": "TOKEN",
    "fleet_name": "NAME",
    "service_name": "NAME",
    "tenants": "NAME:keys=K1|K2,weight=W,priority=P,max_outstanding=N;...",
    "default_tenant": "NAME",
    "session_tool_parser": "PARSER",
}


def _metavar(knob: Knob) -> str:
    if knob.name in _METAVARS:
        return _METAVARS[knob.name]
    if knob.unit == "s":
        return "SECONDS"
    if knob.unit:  # "requests" -> REQUESTS, "retries/s" -> RETRIES_PER_SECOND
        return knob.unit.upper().replace("/S", "_PER_SECOND").replace(" ", "_")
    return {int: "INTEGER", float: "NUMBER"}.get(knob.kind, "TEXT")


def _knob_options(func: Any) -> Any:
    for old, new in RENAMED_KNOBS.items():  # deprecated names, still accepted (they warn)
        flag = "--" + old.replace("_", "-")
        func = click.option(flag, old, default=None, hidden=True, help=f"deprecated: --{new}")(func)
    for knob in reversed(knobs()):
        name = knob.name
        if knob.kind is bool:
            flag = f"{knob.flag}/--no-{knob.flag[2:]}"
            option = click.option(flag, name, default=None, help=_describe(knob))
        else:
            option = click.option(
                knob.flag, name, default=None, metavar=_metavar(knob), help=_describe(knob)
            )
        func = option(func)
    return func


def load_settings(
    config_file: str | None,
    engine: tuple[str, ...],
    flags: dict[str, Any],
    *,
    config_from: str = "--config",
) -> Settings:
    """Settings from the file, environment and flags; ``--engine`` URLs are added to
    ``--engines``. Raises :class:`click.UsageError` (exit status 2) naming the knob,
    or the file (as ``config_from``, where it was named) if it cannot be read."""
    overrides = {k: v for k, v in flags.items() if v is not None}
    if engine:
        extra = tuple(e for part in engine for e in part.split(",") if e.strip())
        listed = overrides.pop("engines", "")
        overrides["engines"] = tuple(e for e in str(listed).split(",") if e.strip()) + extra
    try:
        return Settings.load(config_file=config_file, overrides=overrides)
    except (SettingsError, tomllib.TOMLDecodeError, OSError, TypeError) as exc:
        where = f"{config_from} {config_file}"
        message = explain_bad_settings(exc, where)
        if isinstance(exc, SettingsError) and _from_flags(exc.knob, overrides):
            raise click.UsageError(message) from None  # the command line is wrong
        if isinstance(exc, SettingsError) and config_file and not _from_environment(exc.knob):
            message = f"{where}: {message}"  # the file's value (or a knob it names)
        raise BadSetting(message) from None


class BadSetting(click.ClickException):
    """A bad value from the environment or the TOML file: ``Error: ...`` and exit
    status 2, without click's usage banner (the command line is not what is wrong)."""

    exit_code = 2


def _from_flags(knob: str, overrides: dict[str, Any]) -> bool:
    """Whether the command line set ``knob`` (the winning source)."""
    return any(_current_name(name) == knob for name in overrides)


def _from_environment(knob: str) -> bool:
    """Whether a ``TRIOFORWARD_*`` variable sets ``knob`` (it wins over the file)."""
    names = [knob, *(old for old, new in RENAMED_KNOBS.items() if new == knob)]
    return any(f"TRIOFORWARD_{name.upper()}" in os.environ for name in names)


def _current_name(name: str) -> str:
    return RENAMED_KNOBS.get(name, name)


def explain_bad_settings(exc: Exception, config_file: str, *, flag: bool = True) -> str:
    """One line for a :class:`SettingsError`, a TOML error in ``config_file`` (as the
    user named it) or an unreadable file: the knob with its flag (``flag``) and its
    variable, or the file."""
    if isinstance(exc, SettingsError):
        knob = next((k for k in knobs() if k.name == exc.knob), None)
        if knob is None:
            return str(exc)
        flags = "--engine / --engines" if knob.name == "engines" else knob.flag
        return f"{exc} ({flags} / {knob.env})" if flag else f"{exc} ({knob.env})"
    if isinstance(exc, tomllib.TOMLDecodeError):
        return f"{config_file}: not valid TOML: {exc}"
    if isinstance(exc, OSError):
        return f"{config_file}: {exc.strerror or exc}"
    return f"bad setting: {exc}"


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option(
    "--engine",
    "engine",
    multiple=True,
    metavar="URL",
    help="engine base URL (repeatable), e.g. http://127.0.0.1:8001",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="TOML file of knobs (top level or [trioforward]); default $TRIOFORWARD_CONFIG",
)
@_knob_options
def serve(engine: tuple[str, ...], config_file: str | None, **flags: Any) -> None:
    """Run the gateway under Hypercorn's trio worker until SIGTERM/SIGINT, then drain
    in-flight requests for --shutdown-grace seconds and exit 0."""
    config_from = "--config" if config_file else "$TRIOFORWARD_CONFIG"
    config_file = config_file or os.environ.get("TRIOFORWARD_CONFIG") or None
    settings = load_settings(config_file, engine, flags, config_from=config_from)
    if settings.state_url is not None:
        try:
            import coredis  # noqa: F401  (the fleet's Redis client: docs/fleet.md)
        except ImportError:
            raise click.UsageError(
                "--state-url needs the fleet extra: pip install 'trioforward[fleet]'"
            ) from None
    if settings.workers > 1:  # docs/fleet.md: one socket, N supervised workers
        _configure_logging(settings, with_pid=True)
        from trioforward.server.app._supervisor import supervise

        raise SystemExit(supervise(settings))
    run(settings)


def _configure_logging(settings: Settings, *, with_pid: bool = False) -> None:
    pid = " %(process)d" if with_pid else ""  # which worker of --workers N said it
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s{pid} %(name)s: %(message)s",
    )


def run(settings: Settings, *, bind: str | None = None) -> None:
    """Serve the gateway in this process until SIGTERM/SIGINT (``bind``: Hypercorn
    bind, default ``host:port``; a worker of ``--workers N`` gets ``fd://N``)."""
    _configure_logging(settings, with_pid=bind is not None)
    from trioforward.server.app._app import create_app
    from trioforward.server.app._serve import listen, raise_open_files_limit, tune_gc
    from trioforward.server.app._serve import serve as serve_app

    log = logging.getLogger("trioforward.server")
    if bind is None:
        # Before anything starts: a taken port is one line, as under --workers N.
        try:
            listener = listen(settings)
        except OSError as error:
            log.error(
                "cannot listen on %s:%d: %s", settings.host, settings.port, error.strerror or error
            )
            raise SystemExit(1) from None
        bind = f"fd://{listener.detach()}"  # Hypercorn's from here on: it closes it
    nofile = raise_open_files_limit()
    app = create_app(settings)
    tune_gc()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(functools.partial(serve_app, app, settings, bind=bind))
            log.info(
                "listening on %s (open files limit %d, HTTP/1.1 by %s)", " ".join(binds), nofile, _h11_used()
            )

    try:
        trio.run(main)
    except BaseException as exc:  # noqa: BLE001 - report, then exit 1
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        log.error("gateway failed: %s (see the log above for the cause)", _root(exc))
        raise SystemExit(1) from None
    log.info("stopped")


def _h11_used() -> str:
    """Which h11 the front and the pool use, and the extra to install for the compiled one."""
    from trioforward import _h11

    front = _h11.front_h11().__name__
    used = _h11.name if front == _h11.name else f"{_h11.name} (pool), {front} (front)"
    if _h11.name == _h11.PURE and _h11.ENV not in os.environ:
        used += "; pip install 'trioforward[speedups]' for the compiled h11 (less CPU per request)"
    return used


def _root(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
