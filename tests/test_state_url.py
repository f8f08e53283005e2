"""check_state_url on the one-server and Cluster forms (the Sentinel form:
tests/fleet/test_fleet_sentinel.py): what the Redis client would only find at
startup, or silently ignore, is refused when the settings are built."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from trioforward._settings import Settings, SettingsError
from trioforward._state_url import StateURLError, check_state_url


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://h",
        "redis://h/",
        "rediss://user:pw@h:6380/15",
        "redis://h:6379?password=pw",
        "redis+cluster://h:7000",
        "unix:///tmp/valkey.sock",
        "redis://[::1]:6379/2",
    ],
)
def test_good_state_urls_pass(url: str) -> None:
    check_state_url(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://127.0.0.1:notaport", "port must be a number"),
        ("redis://127.0.0.1:0", "port must be a number"),
        ("redis://127.0.0.1:65536/0", "port must be a number"),
        ("redis://:6379/0", "no host"),
        ("redis://h:6379/x", "only be a db number"),
        ("redis://h:6379/db5", "only be a db number"),
        ("redis+cluster://h:7000/0/1", "only be a db number"),
        ("unix://", "socket's path"),
    ],
)
def test_a_bad_state_url_names_the_knob_and_the_fault_but_not_the_password(url: str, reason: str) -> None:
    with pytest.raises(StateURLError, match=reason):
        check_state_url(url)
    if url.startswith("unix"):
        return
    secret_url = url.replace("://", "://user:hunter2@", 1)
    with pytest.raises(SettingsError) as raised:
        Settings(state_url=secret_url)
    assert raised.value.knob == "state_url" and reason in str(raised.value)
    assert "hunter2" not in str(raised.value)


def test_the_cli_refuses_a_bad_port_with_exit_2_before_starting() -> None:
    from trioforward.cli import main

    result = CliRunner().invoke(
        main, ["serve", "--engine", "http://127.0.0.1:1", "--state-url", "redis://127.0.0.1:notaport"]
    )
    assert result.exit_code == 2
    assert "state_url" in result.output and "port must be a number" in result.output
