"""Settings read each knob's type from its annotation: one table over every knob
type (kind x optional), from TOML values and from environment/CLI text."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

from trioforward import Settings, SettingsError, TenantSpec, knobs
from trioforward._settings import coerce
from trioforward._tenant_spec import TenantSpecError, parse_tenants

# (kind, optional) -> a knob of that type, text inputs and what they read as,
# inputs that are refused, and a TOML (non-text) value with what it reads as.
TABLE: dict[tuple[type, bool], dict[str, Any]] = {
    (int, False): {
        "knob": "engine_capacity",
        "text": {"12": 12, " 7 ": 7, "0": 0},
        "bad_text": ["", "none", "1.5", "x"],
        "bad_value": [-1, 1.5, True, None],
        "toml": (3, 3),
    },
    (int, True): {
        "knob": "max_connections_per_engine",
        "text": {"4": 4, "": None, "none": None, "unlimited": None},
        "bad_text": ["x", "2.0"],
        "bad_value": [-1, "4"],
        "toml": (4, 4),
    },
    (float, False): {
        "knob": "idle_expiry",
        "text": {"2.5": 2.5, "3": 3.0},
        "bad_text": ["", "none", "soon"],
        "bad_value": [-0.1, float("nan"), None, False],
        "toml": (2, 2.0),
    },
    (float, True): {
        "knob": "queue_timeout",
        "text": {"1.5": 1.5, "null": None, "inf": None, "": None},
        "bad_text": ["later"],
        "bad_value": [-1.0, "1"],
        "toml": (5, 5.0),
    },
    (bool, False): {
        "knob": "access_log",
        "text": {"true": True, "YES": True, "1": True, "off": False, "0": False},
        "bad_text": ["maybe", ""],
        "bad_value": [1, None, "true"],
        "toml": (False, False),
    },
    (str, False): {
        "knob": "adapter_root",
        "text": {" /a/b ": "/a/b"},
        "bad_text": [],
        "bad_value": [3, None],
        "toml": ("/x", "/x"),
    },
    (str, True): {
        "knob": "admin_token",
        "text": {"s3cret": "s3cret", "none": None},
        "bad_text": [],
        "bad_value": [3],
        "toml": ("t", "t"),
    },
    (tuple, False): {
        "knob": "api_keys",
        "text": {"a, b,,c": ("a", "b", "c"), "": ()},
        "bad_text": [],
        "bad_value": [("a", 1), "a", None],
        "toml": (["a", "b"], ("a", "b")),
    },
    (TenantSpec, False): {
        "knob": "tenants",
        "text": {
            "a:keys=k1|k2,weight=3,priority=1,max_outstanding=9; b:": {
                "a": TenantSpec(("k1", "k2"), 3.0, 1, 9),
                "b": TenantSpec(),
            },
            "": {},
        },
        "bad_text": ["a", "a:weight=0", "a:weight=x", "a:colour=red", "a:keys=k;b:keys=k", "a b:"],
        "bad_value": [{"a": 1}, ["a"], None, {"a": {"priority": 1.5}}, {"a": {"max_outstanding": -1}}],
        "toml": ({"a": {"keys": ["k"], "weight": 2}}, {"a": TenantSpec(("k",), 2.0)}),
    },
    (dict, False): {
        "knob": "adapters",
        "text": {"x=/p/x, y = /p/y": {"x": "/p/x", "y": "/p/y"}, "": {}},
        "bad_text": [],
        "bad_value": [{"x": 1}, ["x"], None],
        "toml": ({"x": "/p"}, {"x": "/p"}),
    },
}


def test_the_table_covers_every_knob_type() -> None:
    kinds = {(k.kind, k.optional) for k in knobs()}
    assert kinds <= set(TABLE), f"add a row for {kinds - set(TABLE)}"
    for (kind, optional), row in TABLE.items():
        knob = next(k for k in knobs() if k.name == row["knob"])
        assert (knob.kind, knob.optional) == (kind, optional)


@pytest.mark.parametrize("key", list(TABLE), ids=lambda k: f"{k[0].__name__}{'?' if k[1] else ''}")
def test_knob_type_reads_and_refuses(key: tuple[type, bool]) -> None:
    row = TABLE[key]
    name = row["knob"]
    for text, expected in row["text"].items():
        assert coerce(name, text) == expected, text
        assert getattr(Settings.load(environ={f"TRIOFORWARD_{name.upper()}": text}), name) == expected
    for text in row["bad_text"]:
        with pytest.raises(SettingsError) as info:
            Settings.load(environ={f"TRIOFORWARD_{name.upper()}": text})
        assert info.value.knob == name
    for value in row["bad_value"]:
        with pytest.raises(SettingsError) as info:
            Settings(**{name: value})
        assert info.value.knob == name
    toml, expected = row["toml"]
    settings = Settings().replace(**{name: toml})
    assert getattr(settings, name) == expected
    assert type(getattr(settings, name)) is type(expected)


def test_unknown_knob_is_refused_by_name() -> None:
    with pytest.raises(SettingsError) as info:
        coerce("no_such_knob", "1")
    assert info.value.knob == "no_such_knob"


def test_knobs_describe_every_field() -> None:
    names = [k.name for k in knobs()]
    assert names == [f.name for f in dataclasses.fields(Settings)]
    by_name = {k.name: k for k in knobs()}
    assert by_name["api_keys"].type_name == "list of strings"
    assert by_name["queue_timeout"].type_name == "float" and by_name["queue_timeout"].optional


def test_max_queued_is_a_deprecated_alias_of_max_outstanding(tmp_path: Any) -> None:
    with pytest.warns(FutureWarning, match="'max_queued' is deprecated, use 'max_outstanding'"):
        assert Settings().replace(max_queued=7).max_outstanding == 7
    with pytest.warns(FutureWarning, match="TRIOFORWARD_MAX_QUEUED"):
        loaded = Settings.load(environ={"TRIOFORWARD_MAX_QUEUED": "8"})
    assert loaded.max_outstanding == 8
    # The new name wins when both are set.
    with pytest.warns(FutureWarning):
        both = Settings.load(
            environ={"TRIOFORWARD_MAX_QUEUED": "8", "TRIOFORWARD_MAX_OUTSTANDING": "9"},
            overrides={"max_queued": None},
        )
    assert both.max_outstanding == 9
    toml = tmp_path / "gw.toml"
    toml.write_text("max-queued = 5\n")
    with pytest.warns(FutureWarning):
        assert Settings.load(config_file=toml, environ={}).max_outstanding == 5
    with pytest.warns(FutureWarning):
        assert Settings.load(environ={}, overrides={"max_queued": "6"}).max_outstanding == 6
    with pytest.warns(FutureWarning):
        assert Settings(max_outstanding=4).max_queued == 4


def test_serve_accepts_the_deprecated_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from trioforward.server.app import _cli

    seen: list[int] = []
    load = _cli.load_settings

    def load_then_stop(config_file: Any, engine: Any, flags: dict[str, Any], **kw: Any) -> Settings:
        seen.append(load(config_file, engine, flags, **kw).max_outstanding)
        raise SystemExit(0)

    monkeypatch.setattr(_cli, "load_settings", load_then_stop)
    with pytest.warns(FutureWarning, match="max_queued"):
        result = CliRunner().invoke(_cli.serve, ["--max-queued", "11"])
    assert result.exit_code == 0 and seen == [11]


def test_a_misspelt_knob_names_the_nearest_one(tmp_path: Any) -> None:
    with pytest.raises(SettingsError, match=r"unknown setting; did you mean 'dispatch_timeout'\?"):
        Settings().replace(dispach_timeout=3)
    path = tmp_path / "gateway.toml"
    path.write_text("engine_capasity = 4\n")
    with pytest.raises(SettingsError, match=r"did you mean 'engine_capacity'\?") as info:
        Settings.load(config_file=path, environ={})
    assert info.value.knob == "engine_capasity"


def test_a_knob_outside_the_trioforward_table_is_refused(tmp_path: Any) -> None:
    # With a [trioforward] table, only it is read: a knob left at the top level was
    # silently dropped (here: the engines), so the gateway started with none.
    path = tmp_path / "gateway.toml"
    path.write_text('engines = ["http://127.0.0.1:8001"]\n\n[trioforward]\nengine_capacity = 64\n')
    with pytest.raises(SettingsError, match=r"outside the \[trioforward\] table") as info:
        Settings.load(config_file=path, environ={})
    assert info.value.knob == "engines"
    # Other programs' tables and keys beside [trioforward] are left alone.
    path.write_text('owner = "rl-team"\n[trioforward]\nengine_capacity = 64\n[other_tool]\nengines = 1\n')
    assert Settings.load(config_file=path, environ={}).engine_capacity == 64
    path.write_text("trioforward = 3\n")
    with pytest.raises(SettingsError, match="must be a table"):
        Settings.load(config_file=path, environ={})


def test_a_misspelt_variable_is_warned_about_not_silently_ignored() -> None:
    env = {"TRIOFORWARD_ENGIN_CAPACITY": "3", "TRIOFORWARD_ROUTING": "session"}
    with pytest.warns(UserWarning, match="TRIOFORWARD_ENGIN_CAPACITY is not a trioforward setting and is ignored; did you mean TRIOFORWARD_ENGINE_CAPACITY") as record:
        settings = Settings.load(environ=env)
    assert len(record) == 1 and settings.routing == "session"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the project's own non-knob variables are not warned about
        Settings.load(environ={"TRIOFORWARD_CONFIG": "x.toml", "TRIOFORWARD_WORKER_FD": "3", "PATH": "/bin"})


def test_secrets_are_not_in_the_settings_repr() -> None:
    # A trainer printing its Settings, or a traceback showing locals, must not leak
    # the keys (as state_url's password is kept out).
    settings = Settings(api_keys=("sk-hunter2",), admin_token="adm-hunter2", state_url="redis://u:pw-hunter2@h:1/0")
    assert "hunter2" not in repr(settings)
    assert settings.api_keys == ("sk-hunter2",) and settings.admin_token == "adm-hunter2"


def test_the_log_level_is_read_in_either_case() -> None:
    assert Settings(log_level="DEBUG").log_level == "debug"
    assert Settings.load(environ={"TRIOFORWARD_LOG_LEVEL": "Warning"}).log_level == "warning"
    with pytest.raises(SettingsError, match="must be one of debug, info, warning, error"):
        Settings(log_level="verbose")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a:weight=abc", "tenant 'a': weight must be a number > 0 (got 'abc')"),
        ("a:priority=high", "tenant 'a': priority must be an integer (got 'high')"),
        ("a:max_outstanding=1.5", "tenant 'a': max_outstanding must be an integer >= 0 (got '1.5')"),
    ],
)
def test_a_bad_tenant_field_is_named_with_its_value(text: str, says: str) -> None:
    with pytest.raises(TenantSpecError) as info:
        parse_tenants(text)
    assert str(info.value) == says


def test_lists_are_as_good_as_tuples() -> None:
    # Settings(engines=[...]) was refused: "must be a list of strings (got [...])".
    settings = Settings(engines=["http://127.0.0.1:8001"], api_keys=["k1", "k2"])
    assert settings.engines == ("http://127.0.0.1:8001",) and settings.api_keys == ("k1", "k2")
    assert settings.replace(engines=["http://127.0.0.1:8002"]).engines == ("http://127.0.0.1:8002",)
    with pytest.raises(SettingsError, match="must be a list or tuple of strings"):
        Settings(engines=[8001])


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ('engine_capacity = "8"', "setting 'engine_capacity': must be an integer in TOML, not a string (got '8')"),
        ('access_log = "yes"', "setting 'access_log': must be a boolean (true/false) in TOML, not a string (got 'yes')"),
        (
            'engines = "http://127.0.0.1:8001"',
            "setting 'engines': must be a list of strings in TOML, not a string (got 'http://127.0.0.1:8001')",
        ),
        ('[tenants.a]\nkeys = "k1"', "setting 'tenants': tenant 'a': keys must be a list of strings in TOML, not a string"),
        ('[tenants.a]\nkeys = ["k1"]\nweight = "3"', "setting 'tenants': tenant 'a': weight must be a number in TOML, not a string"),
        ('[tenants.a]\nkeys = ["k1"]\nweight = -1', "setting 'tenants': tenant 'a': weight must be a number > 0 (got -1)"),
    ],
)
def test_a_toml_value_of_the_wrong_type_is_refused_naming_the_key_and_the_type(
    tmp_path: Any, toml: str, says: str
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(toml)
    with pytest.raises(SettingsError) as info:
        Settings.load(config_file=str(path), environ={})
    assert str(info.value) == says  # one "(got ...)" at most, never a key


def test_the_one_string_form_still_reads_strings() -> None:
    settings = Settings.load(environ={"TRIOFORWARD_TENANTS": "a:keys=k1|k2,weight=3", "TRIOFORWARD_ENGINE_CAPACITY": "8"})
    assert settings.tenants["a"].keys == ("k1", "k2") and settings.tenants["a"].weight == 3.0
    assert settings.engine_capacity == 8
    with pytest.raises(SettingsError) as info:
        Settings.load(environ={"TRIOFORWARD_TENANTS": "a:weight=abc"})
    assert str(info.value) == "setting 'tenants': tenant 'a': weight must be a number > 0 (got 'abc')"
