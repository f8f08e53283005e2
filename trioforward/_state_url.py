"""The forms ``state_url`` takes (docs/fleet.md, "Topologies"), checked without importing a
Redis client, and the one way a URL is shown in logs and errors (password hidden).

- ``redis://``, ``rediss://``, ``unix://``: one server (coredis ``Redis.from_url``);
- ``redis+cluster://``, ``rediss+cluster://``: a Cluster startup node;
- ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db]``:
  the Sentinel daemons to ask where the primary of ``service_name`` is
  (port 26379 when omitted). The credentials and ``db`` are the data
  nodes'; the Sentinel daemons are asked without credentials. This is the
  ``redis+sentinel://`` form of the Redis-Sentinel-Url package
  (https://pypi.org/project/Redis-Sentinel-Url/), also accepted by RedisVL
  and Prefect; query options are refused here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

__all__ = [
    "STATE_URL_SCHEMES",
    "SENTINEL_PORT",
    "SentinelTarget",
    "StateURLError",
    "check_state_url",
    "parse_sentinel_url",
    "redact_url",
]

STATE_URL_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel")
SENTINEL_PORT = 26379  # Sentinel's default port (https://valkey.io/topics/sentinel/)
_SENTINEL_SHAPE = "a Sentinel URL looks like redis+sentinel://host:port[,host:port...]/service_name[/db]"


class StateURLError(ValueError):
    """``state_url`` is unusable; ``.reason`` says why, never repeating the URL
    (it may carry a password)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """A parsed ``redis+sentinel://`` URL: ``sentinels`` as ``(host, port)`` pairs
    in the URL's order, the monitored ``service_name``, the data nodes' ``db``
    (0 when omitted) and credentials (``None`` when absent)."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def check_state_url(url: str) -> None:
    """Raise :class:`StateURLError` unless ``url`` has one of :data:`STATE_URL_SCHEMES`
    (and, for ``redis+sentinel://``, parses: see :func:`parse_sentinel_url`)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in STATE_URL_SCHEMES:
        raise StateURLError(f"scheme must be one of {', '.join(STATE_URL_SCHEMES)}")
    if scheme == "redis+sentinel":
        parse_sentinel_url(url)
    elif scheme == "unix":
        if not urlsplit(url).path.strip("/"):
            raise StateURLError("a unix:// URL names the socket's path: unix:///path/to/socket")
    else:
        _check_server_url(url)


_SERVER_SHAPE = "a Redis URL looks like redis://[[user]:password@]host[:port][/db]"


def _check_server_url(url: str) -> None:
    """A host, a port in 1..65535 if given, and nothing but a db number as the path.
    The Redis client reads a bad port only when the gateway starts (a startup failure
    that does not name ``state_url``), and ignores a path that is not a number: the
    fleet would share db 0 with whatever else uses it."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise StateURLError(f"the port must be a number in 1..65535; {_SERVER_SHAPE}")
    if not parts.hostname:
        raise StateURLError(f"no host; {_SERVER_SHAPE}")
    if parts.path not in ("", "/") and not _DB_PATH.fullmatch(parts.path):
        raise StateURLError(f"the path can only be a db number (/0, /1, ...); {_SERVER_SHAPE}")


_DB_PATH = re.compile(r"/[0-9]+")


def parse_sentinel_url(url: str) -> SentinelTarget:
    """``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db]``
    split into its parts. IPv6 hosts go in brackets (``[::1]:26379``);
    percent-escapes in the credentials are decoded.

    Raises :class:`StateURLError` for another scheme, no host, a port that is
    not a number in 1..65535, no service name, a ``db`` that is not a number
    >= 0, extra path parts, a query or a fragment.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "redis+sentinel":
        raise StateURLError(f"not a Sentinel URL; {_SENTINEL_SHAPE}")
    if "?" in rest or "#" in rest:
        raise StateURLError(f"a Sentinel URL takes no query or fragment; {_SENTINEL_SHAPE}")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = tuple(_host_port(entry) for entry in hosts.split(","))
    parts = path.split("/") if path else []
    if not parts or not parts[0]:
        raise StateURLError(f"no service name; {_SENTINEL_SHAPE}")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise StateURLError(f"after the service name only a db number may follow; {_SENTINEL_SHAPE}")
    db = int(parts[1]) if len(parts) == 2 else 0
    return SentinelTarget(sentinels, unquote(parts[0]), db, username, password)


def _host_port(entry: str) -> tuple[str, int]:
    if entry.startswith("["):
        host, bracket, tail = entry[1:].partition("]")
        if not bracket:
            raise StateURLError(f"an IPv6 host needs its closing bracket; {_SENTINEL_SHAPE}")
        port_text = tail[1:] if tail.startswith(":") else tail
        if tail and not tail.startswith(":"):
            raise StateURLError(f"unexpected text after an IPv6 host; {_SENTINEL_SHAPE}")
    else:
        host, _, port_text = entry.partition(":")
    if not host:
        raise StateURLError(f"a Sentinel host is missing; {_SENTINEL_SHAPE}")
    if not port_text:
        return host, SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise StateURLError(f"a Sentinel port must be a number in 1..65535; {_SENTINEL_SHAPE}")
    return host, int(port_text)


_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&#]*")


def redact_url(url: str) -> str:
    """``url`` with any password (in the userinfo or a ``password=`` query option)
    replaced by ``***``: what logs and errors show. Works on every
    :data:`STATE_URL_SCHEMES` form, a Sentinel host list included."""
    url = _QUERY_PASSWORD.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, hosts = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:***@{hosts}{tail}"
