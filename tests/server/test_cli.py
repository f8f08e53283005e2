"""``trioforward serve``: flags generated from every knob, environment, TOML, bad values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from trioforward._settings import Settings, knobs
from trioforward.cli import main
from trioforward.server.app._cli import load_settings


def test_help_documents_every_knob_with_default_and_env() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for knob in knobs():
        assert knob.flag in text
        assert knob.env in text
    for flag in ("--engine URL", "--config FILE", "--host", "--port", "--no-access-log"):
        assert flag in text
    assert "[default: 4096 connections" in text
    assert "[default: 75.0 s" in text


def test_help_names_what_each_value_is_and_counts_in_the_singular_for_one() -> None:
    text = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    assert " TEXT " not in text, text
    for option in ("--port PORT", "--host ADDRESS", "--routing POLICY", "--log-level LEVEL",
                   "--engine-kind KIND", "--idle-expiry SECONDS", "--engines URL,...",
                   "--retry-budget-min RETRIES_PER_SECOND"):
        assert option in text, option
    for default in ("[default: 1 retry;", "[default: 1 success;", "[default: 1 process;",
                    "[default: 4 retries;", "[default: 0.2;"):
        assert default in text, default


@pytest.mark.parametrize(
    ("args", "knob"),
    [
        (["--engine-capacity", "lots"], "engine_capacity"),
        (["--dispatch-timeout", "-1"], "dispatch_timeout"),
        (["--routing", "random"], "routing"),
        (["--engine", "localhost:8000"], "engines"),
        (["--log-level", "loud"], "log_level"),
    ],
)
def test_bad_values_exit_2_naming_the_knob(args: list[str], knob: str) -> None:
    result = CliRunner().invoke(main, ["serve", *args])
    assert result.exit_code == 2
    assert repr(knob) in result.output


def test_bad_environment_value_exits_2() -> None:
    result = CliRunner().invoke(main, ["serve"], env={"TRIOFORWARD_KEEP_ALIVE": "forever"})
    assert result.exit_code == 2
    assert "'keep_alive'" in result.output and "TRIOFORWARD_KEEP_ALIVE" in result.output


def test_a_misspelt_variable_is_one_warning_line_naming_the_nearest_knob() -> None:
    # In its own process: pytest records warnings itself, which would hide how the
    # command shows them. The bad value makes serve exit 2 before it binds.
    env = {**os.environ, "TRIOFORWARD_ENGIN_CAPACITY": "3", "TRIOFORWARD_KEEP_ALIVE": "forever"}
    argv = [sys.executable, "-m", "trioforward", "serve"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert (
        "warning: TRIOFORWARD_ENGIN_CAPACITY is not a trioforward setting and is ignored;"
        " did you mean TRIOFORWARD_ENGINE_CAPACITY?"
    ) in lines, lines
    assert "UserWarning" not in result.stderr and "Settings.load" not in result.stderr


def test_precedence_file_env_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(
        '[trioforward]\nengines = ["http://127.0.0.1:9001"]\nengine_capacity = 8\nkeep_alive = 10\nport = 7000\n'
    )
    monkeypatch.setenv("TRIOFORWARD_ENGINE_CAPACITY", "16")
    monkeypatch.setenv("TRIOFORWARD_QUEUE_TIMEOUT", "none")
    settings = load_settings(str(config), ("http://127.0.0.1:9002",), {"port": "7001", "access_log": False})
    assert settings.engines == ("http://127.0.0.1:9001", "http://127.0.0.1:9002") or settings.engines == (
        "http://127.0.0.1:9002",
    )
    assert settings.engine_capacity == 16
    assert settings.keep_alive == 10.0
    assert settings.queue_timeout is None
    assert settings.port == 7001
    assert settings.access_log is False


def test_bad_toml_is_an_error_naming_the_file_not_a_usage_error(tmp_path: Path) -> None:
    from trioforward.server.app._cli import BadSetting

    config = tmp_path / "gw.toml"
    config.write_text("engine_capacity = [")
    with pytest.raises(BadSetting, match="not valid TOML") as info:
        load_settings(str(config), (), {})
    assert not isinstance(info.value, click.UsageError) and info.value.exit_code == 2
    config.write_text("no_such_knob = 1\n")
    with pytest.raises(BadSetting, match="no_such_knob"):
        load_settings(str(config), (), {})


@pytest.mark.parametrize("source", ["flag", "environment", "file"])
def test_a_bad_value_is_blamed_on_where_it_came_from(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only a bad flag gets click's "Usage: ... Try --help" banner; a bad value
    # from the environment or the TOML file is one Error line (the file named).
    config = tmp_path / "gw.toml"
    config.write_text('engine_capacity = "lots"\n' if source == "file" else "")
    args = ["serve", "--config", str(config)]
    if source == "flag":
        args += ["--engine-capacity", "lots"]
    env = {"TRIOFORWARD_ENGINE_CAPACITY": "lots"} if source == "environment" else {}
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 2, result.output
    assert "'engine_capacity'" in result.output
    assert ("Usage:" in result.output) == (source == "flag"), result.output
    assert ("Try " in result.output) == (source == "flag"), result.output
    assert (str(config) in result.output) == (source == "file"), result.output


def test_create_app_without_arguments_reads_config_file_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioforward.server import create_app

    config = tmp_path / "gw.toml"
    config.write_text('engines = ["http://127.0.0.1:9001"]\nengine_capacity = 8\n')
    monkeypatch.setenv("TRIOFORWARD_CONFIG", str(config))
    monkeypatch.setenv("TRIOFORWARD_ENGINE_CAPACITY", "32")
    monkeypatch.setenv("TRIOFORWARD_MAX_BODY_SIZE", "1000")
    app = create_app()
    settings = app.config["TRIOFORWARD_SETTINGS"]
    assert settings.engines == ("http://127.0.0.1:9001",)
    assert settings.engine_capacity == 32
    assert app.config["MAX_CONTENT_LENGTH"] == 1000


def test_create_app_without_arguments_warns_that_the_workers_knob_is_ignored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under the hypercorn command (docs/server.md) TRIOFORWARD_WORKERS=2 did nothing, silently."""
    from trioforward.server import create_app

    caplog.set_level("WARNING", logger="trioforward.server")
    monkeypatch.setenv("TRIOFORWARD_WORKERS", "2")
    create_app()
    [record] = [r for r in caplog.records if r.name == "trioforward.server"]
    assert record.getMessage().startswith("workers = 2 is ignored here"), record.getMessage()
    caplog.clear()
    create_app(Settings(workers=2))  # trioforward serve's own supervisor passes them
    assert not [r for r in caplog.records if r.name == "trioforward.server"]


@pytest.mark.parametrize("where", ["missing.toml", "."])
def test_serve_names_an_unreadable_trioforward_config_file_and_exits_2(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / where
    monkeypatch.setenv("TRIOFORWARD_CONFIG", str(path))
    result = CliRunner().invoke(main, ["serve", "--engine", "http://127.0.0.1:8001"])
    assert result.exit_code == 2, result.output
    assert f"Error: $TRIOFORWARD_CONFIG {path}: " in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TRIOFORWARD_ROUTING", "fastest", "setting 'routing': "),
        ("TRIOFORWARD_CONFIG", "{missing}", "$TRIOFORWARD_CONFIG {missing}: No such file"),
        ("TRIOFORWARD_CONFIG", "{bad_toml}", "$TRIOFORWARD_CONFIG {bad_toml}: not valid TOML"),
    ],
)
def test_create_app_without_arguments_names_a_bad_setting_in_one_line_and_exits_2(
    variable: str, value: str, message: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The hypercorn command's entry (docs/server.md, "Under the hypercorn command")."""
    from trioforward.server import create_app

    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("engine_capacity = [")
    paths = {"missing": tmp_path / "missing.toml", "bad_toml": bad_toml}
    monkeypatch.setenv(variable, value.format(**paths))
    with pytest.raises(SystemExit) as exited:
        create_app()
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("Error: " + message.format(**paths)), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--state-url", "redis://127.0.0.1:1"], "--state-url needs the fleet extra"),
        (["--workers", "2"], "--workers 2 needs shared state: install the fleet extra"),
    ],
)
def test_fleet_knobs_without_the_fleet_extra_exit_2_naming_it(
    args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "coredis", None)  # `import coredis` raises ImportError
    result = CliRunner().invoke(main, ["serve", "--engine", "http://127.0.0.1:8001", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "pip install 'trioforward[fleet]'" in result.output
    assert "Traceback" not in result.output
