"""The fleet's one connection to its shared state: a coredis client, its keys and errors.

coredis runs on trio through anyio (https://coredis.readthedocs.io). Every key of
a fleet carries the hash tag ``{fleet_name}``, so on a Redis Cluster all of them
live in one slot and multi-key commands (``MGET``) and pipelines stay legal
(Redis Cluster specification, "Hash tags").
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import coredis
from coredis.connection import TCPLocation
from coredis.exceptions import RedisError

from trioforward._state_url import parse_sentinel_url

__all__ = ["open_redis", "open_sentinel_primary", "Keys", "STATE_ERRORS", "Redis"]


def _not_a_script_reload(record: logging.LogRecord) -> bool:
    """Drops coredis's INFO line for the retry that loads a Lua script the server
    does not hold yet (``Retry attempt 1 due to error: No matching script...``):
    the fleet's scripts are sent by hash, so that happens on first use and after
    a restart or failover, by design, and read like a failure in the log."""
    if record.levelno > logging.INFO:
        return True
    message = record.getMessage()
    return not (message.startswith("Retry attempt") and "No matching script" in message)


# coredis logs on the "coredis" logger (coredis/_utils.py; the retry in coredis/retry.py).
logging.getLogger("coredis").addFilter(_not_a_script_reload)

Redis = coredis.Redis  # the client type the fleet modules are written against

# What a Redis outage looks like from here: coredis's own errors, a socket error
# that escaped them, or a timeout of ours.
STATE_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)

_CLUSTER_SUFFIX = "+cluster"
_SENTINEL_SCHEME = "redis+sentinel"


@asynccontextmanager
async def open_redis(url: str, *, reply_timeout: float) -> AsyncIterator[Any]:
    """A coredis client for ``url``, open for the block (its pool closes at exit).

    ``redis://``, ``rediss://`` and ``unix://`` URLs go to ``coredis.Redis``;
    ``redis+cluster://`` and ``rediss+cluster://`` to ``coredis.RedisCluster``
    (startup node in the URL); ``redis+sentinel://`` to the primary of its
    service through ``coredis.Sentinel`` (see :func:`open_sentinel_primary`).
    ``reply_timeout`` (s) bounds each connect and each reply, so an
    unreachable server costs a bounded wait, never a hang. The client retries
    nothing itself: the fleet's loops retry on their next tick. Connecting is
    lazy: an unreachable server raises on the first command.
    """
    options: dict[str, Any] = {
        "connect_timeout": reply_timeout,
        "stream_timeout": reply_timeout,
        "retry_policy": coredis.retry.NoRetryPolicy(),
        "decode_responses": False,
    }
    scheme, rest = url.split("://", 1)
    if scheme.lower() == _SENTINEL_SCHEME:
        async with open_sentinel_primary(url, reply_timeout=reply_timeout) as primary:
            yield primary
        return
    if scheme.endswith(_CLUSTER_SUFFIX):
        base = scheme[: -len(_CLUSTER_SUFFIX)]
        client: Any = coredis.RedisCluster.from_url(f"{base}://{rest}", **options)
    else:
        client = coredis.Redis.from_url(url, **options)
    async with client:
        yield client


@asynccontextmanager
async def open_sentinel_primary(url: str, *, reply_timeout: float) -> AsyncIterator[Any]:
    """The primary of a ``redis+sentinel://`` URL's service, as a ``coredis.Redis``
    whose pool asks the Sentinel daemons where the primary is each time it opens a
    connection (``coredis.Sentinel.primary_for``; each new connection checks the
    server's ``ROLE`` is ``master``). After a failover the old connections fail,
    the fleet's tick reports an outage, and the next connection goes to the
    promoted replica: the member recovers like after any Redis outage.

    The URL's credentials and ``db`` are the data nodes'; the Sentinel daemons
    are asked without credentials, each ask bounded by ``reply_timeout`` (s).
    Raises ``StateURLError`` (a ``ValueError``) for a malformed URL.
    """
    target = parse_sentinel_url(url)
    sentinel = coredis.Sentinel(
        [TCPLocation(host, port) for host, port in target.sentinels],
        sentinel_kwargs={"connect_timeout": reply_timeout, "stream_timeout": reply_timeout},
        retry_policy=coredis.retry.NoRetryPolicy(),
        decode_responses=False,
        username=target.username,
        password=target.password,
        db=target.db,
        connect_timeout=reply_timeout,
        stream_timeout=reply_timeout,
    )
    async with sentinel:
        primary = sentinel.primary_for(target.service_name)
        async with primary:
            yield primary


class Keys:
    """The names of one fleet's keys (all under the hash tag ``{fleet_name}``)."""

    __slots__ = ("prefix",)

    def __init__(self, fleet_name: str) -> None:
        self.prefix = f"trioforward:{{{fleet_name}}}:"

    @property
    def members(self) -> str:
        """SET of member ids that ever joined (pruned when their record expired)."""
        return self.prefix + "members"

    def member(self, member_id: str) -> str:
        """A member's record (JSON: host, pid, demand per engine), expiring after
        ``member_ttl`` unless the member rewrites it: its heartbeat."""
        return self.prefix + "member:" + member_id

    @property
    def done(self) -> str:
        """Pub/sub channel: ids of finished futures, space-separated, one message per batch."""
        return self.prefix + "done"

    def dedupe(self, session: str, seq_id: str) -> str:
        """``(sampling session, seq id)`` -> the request id issued for it."""
        return f"{self.prefix}seq:{session}:{seq_id}"

    def result(self, request_id: str) -> str:
        """A finished future's bytes: content type, newline, body (retention TTL)."""
        return self.prefix + "result:" + request_id

    def finished(self, request_id: str) -> str:
        """Marker that a future finished (outlives its result: 410, not a wait)."""
        return self.prefix + "finished:" + request_id

    @property
    def announce(self) -> str:
        """Pub/sub channel: the version of each control-plane change."""
        return self.prefix + "announce"

    def control(self, part: str) -> str:
        """Control-plane state: ``version``, ``paused``, ``engines``, ``adapters``."""
        return self.prefix + "control:" + part
