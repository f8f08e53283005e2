"""Value objects of the pool: responses, statistics, and parsed request targets."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Response", "PoolStatistics", "Target", "parse_target"]


@dataclass(slots=True)
class Response:
    """A complete HTTP/1.1 response.

    Attributes:
        status: the status code (e.g. ``200``).
        headers: ``[(name, value), ...]`` as bytes, names lower-cased, in wire order.
        content: the whole body (chunked framing removed).
        reused: ``True`` if it came over a connection that had served a request before.
    """

    status: int
    headers: list[tuple[bytes, bytes]]
    content: bytes
    reused: bool


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of :meth:`ConnectionPool.statistics`, summed over origins.

    Attributes:
        idle: open connections parked in the idle deques.
        active: connections currently driven by a request (headers or body in flight).
        connecting: TCP connects in progress (each holds a slot).
        waiting: tasks queued for a slot (``max_connections`` reached).
        opened_total: connections ever opened.
        reused_total: requests served on a connection taken from an idle deque.
        closed_total: connections ever closed (expired, broken, ``Connection: close``, ...).
    """

    idle: int
    active: int
    connecting: int
    waiting: int
    opened_total: int
    reused_total: int
    closed_total: int


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed ``http://host:port/path?query`` URL.

    ``key`` is the origin string ``"http://host:port"``; ``host_header`` the
    ``Host`` value; ``path`` the request target (path and query) as bytes.
    """

    key: str
    host: str
    port: int
    host_header: bytes
    path: bytes


def parse_target(url: str) -> Target:
    """Split ``url`` (``http://`` only; the engines speak plain HTTP/1.1).

    Raises ``ValueError`` for another scheme or a URL without a host.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "http":
        raise ValueError(f"only http:// URLs are supported, got {url!r}")
    slash = rest.find("/")
    question = rest.find("?")
    cut = min(i for i in (slash, question, len(rest)) if i >= 0)
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        raise ValueError(f"credentials in URLs are not supported: {url!r}")
    if authority.startswith("["):  # [v6]:port (RFC 3986 §3.2.2)
        end = authority.find("]")
        host, port_text = authority[1:end], authority[end + 2 :]
    else:
        host, _, port_text = authority.partition(":")
    if not host:
        raise ValueError(f"no host in {url!r}")
    port = int(port_text) if port_text else 80
    if not 0 < port < 65536:
        raise ValueError(f"bad port in {url!r}")
    if not path:
        path = "/"
    elif path[0] == "?":
        path = "/" + path
    shown = f"[{host}]" if ":" in host else host
    authority = shown if port == 80 else f"{shown}:{port}"
    return Target(
        key=f"http://{shown}:{port}",
        host=host,
        port=port,
        host_header=authority.encode("ascii"),
        path=path.encode("ascii"),
    )
