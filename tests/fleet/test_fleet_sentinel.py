"""A fleet through Redis Sentinel (docs/fleet.md, "Topologies"): the ``redis+sentinel://``
form of ``state_url``, checked without a Redis client and never echoing a password,
and two members on a real Sentinel-managed Valkey that keep working as one fleet
across a failover."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
import trio
from click.testing import CliRunner
from fleet_testing import open_members, sample_body, until_members
from gateway_harness import generation_requests, open_sim

from trioforward._settings import Settings, SettingsError
from trioforward._state_url import SentinelTarget, StateURLError, parse_sentinel_url, redact_url


def test_sentinel_urls_parse_into_hosts_service_db_and_credentials() -> None:
    assert parse_sentinel_url("redis+sentinel://s1:26380,s2,[::1]:5/svc/3") == SentinelTarget(
        (("s1", 26380), ("s2", 26379), ("::1", 5)), "svc", 3
    )
    target = parse_sentinel_url("redis+sentinel://app:p%40ss@127.0.0.1:1/svc")
    assert (target.username, target.password, target.db) == ("app", "p@ss", 0)
    assert "p@ss" not in repr(target)
    assert parse_sentinel_url("redis+sentinel://:secret@h/svc").username is None


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel://h:1", "no service name"),
        ("redis+sentinel://h:1/", "no service name"),
        ("redis+sentinel://h:99999/svc", "port must be a number"),
        ("redis+sentinel://h:x/svc", "port must be a number"),
        ("redis+sentinel://h:1,/svc", "host is missing"),
        ("redis+sentinel://[::1/svc", "closing bracket"),
        ("redis+sentinel://h/svc/zero", "only a db number"),
        ("redis+sentinel://h/svc/1/2", "only a db number"),
        ("redis+sentinel://h/svc?db=1", "no query"),
    ],
)
def test_a_bad_sentinel_url_names_the_knob_and_the_fault_but_not_the_password(url: str, reason: str) -> None:
    with pytest.raises(StateURLError, match=reason):
        parse_sentinel_url(url)
    secret_url = url.replace("://", "://user:hunter2@", 1)
    with pytest.raises(SettingsError) as raised:
        Settings(state_url=secret_url)
    assert raised.value.knob == "state_url" and reason in str(raised.value)
    assert "hunter2" not in str(raised.value) and "***" in str(raised.value)


def test_redaction_hides_every_password_form() -> None:
    assert redact_url("redis+sentinel://u:pw@a:1,b:2/svc/0") == "redis+sentinel://u:***@a:1,b:2/svc/0"
    assert redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("redis://h:6379?password=pw&db=1") == "redis://h:6379?password=***&db=1"
    assert redact_url("unix:///tmp/v.sock") == "unix:///tmp/v.sock"
    assert redact_url("redis://user@h/0") == "redis://user@h/0"


def test_the_cli_refuses_a_bad_sentinel_url_with_exit_2_and_no_password() -> None:
    from trioforward.cli import main

    result = CliRunner().invoke(
        main, ["serve", "--engine", "http://127.0.0.1:1", "--state-url", "redis+sentinel://u:hunter2@h:0/svc"]
    )
    assert result.exit_code == 2
    assert "state_url" in result.output and "port must be a number" in result.output
    assert "hunter2" not in result.output


async def test_the_client_asks_the_sentinels_for_the_primary_of_the_service() -> None:
    from trioforward.fleet._redis import open_redis

    url = "redis+sentinel://app:pw@127.0.0.1:7001,127.0.0.1:7002/svc/2"
    async with open_redis(url, reply_timeout=0.5) as redis:  # lazy: nothing connects here
        pool = redis.connection_pool
        assert pool.service_name == "svc" and pool.is_primary
        assert [(s.connection_pool.location.host, s.connection_pool.location.port)
                for s in pool.sentinel_manager.sentinels] == [("127.0.0.1", 7001), ("127.0.0.1", 7002)]
        kwargs = pool.connection_kwargs
        assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (2, "app", "pw")
        assert kwargs["stream_timeout"] == kwargs["connect_timeout"] == 0.5


async def _submit_here_poll_there(a: httpx.AsyncClient, b: httpx.AsyncClient, seq: int) -> None:
    """One Tinker sample submitted on ``a`` and retrieved on ``b``: both members
    read and write the fleet's shared futures through the Sentinel's primary."""
    session = (await a.post(
        "/api/v1/create_sampling_session",
        json={"session_id": f"s{seq}", "sampling_session_seq_id": 0, "base_model": "sim-base"},
    )).json()["sampling_session_id"]
    issued = await a.post("/api/v1/asample", json=sample_body(session, seq, num_samples=1))
    assert issued.status_code == 200, issued.text
    polled = await b.post("/api/v1/retrieve_future", json={"request_id": issued.json()["request_id"]})
    assert polled.status_code == 200, polled.text


async def test_two_members_through_sentinel_stay_one_fleet_across_a_failover(
    sentinel_valkey: Any, fleet_name: str
) -> None:
    topology = sentinel_valkey
    with trio.fail_after(30):
        await topology.until_replica_known()
    async with open_sim(capacity=0) as engine, AsyncExitStack() as stack:
        a, b = await open_members(engine.url, topology, fleet_name, stack)
        with trio.fail_after(30):
            await until_members([a, b], 2)
        ca = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        cb = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        await _submit_here_poll_there(ca, cb, 1)
        # A control-plane change on A is applied by B before the call returns.
        await a.state.fleet.control.pause(None, "wait")
        assert all(e.paused for e in b.state.client.engines.list())
        await b.state.fleet.control.resume(None)
        assert not any(e.paused for e in a.state.client.engines.list())

        await topology.replicate_everything()
        topology.primary.terminate()  # the primary dies (SIGKILL)
        with trio.fail_after(60):
            while not (a.state.fleet.degraded and b.state.fleet.degraded):
                await a.state.fleet.wait_tick()
            await topology.until_promoted()
            # No restart: each member's next connection goes to the promoted replica.
            while a.state.fleet.degraded or b.state.fleet.degraded:
                await a.state.fleet.wait_tick()
            await until_members([a, b], 2)
        await _submit_here_poll_there(cb, ca, 2)
        await b.state.fleet.control.pause(None, "wait")
        assert all(e.paused for e in a.state.client.engines.list())
        await a.state.fleet.control.resume(None)
        assert generation_requests(engine) == 2
