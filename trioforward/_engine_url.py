"""The one rule for an engine URL, used by the settings, ``client.engines.add`` and
``POST /admin/engines`` alike (docs/server.md, "Engine URLs").

An engine URL is the engine's root, ``http://host:port`` (optionally a path
prefix in front of ``/v1``): the gateway appends ``/v1/completions`` and the
other endpoint paths itself.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["EngineURLError", "engine_url"]

_SHAPE = "an engine URL looks like http://host:port"


class EngineURLError(ValueError):
    """``url`` cannot name an engine. ``.url`` is what was given, ``.reason`` says
    what is wrong with it (without repeating the URL)."""

    def __init__(self, url: object, reason: str) -> None:
        super().__init__(f"engine URL {url!r}: {reason}")
        self.url = url
        self.reason = reason


def engine_url(url: object) -> str:
    """``url`` checked and normalised (scheme lower-cased, no trailing ``/``).

    Refused, each with its own reason: not a string, whitespace, a scheme other
    than ``http`` (the engines speak plain HTTP/1.1), no host, a port that is not
    a number in 1..65535, credentials (``user@``), a query or fragment (the
    gateway appends endpoint paths), and a path ending in ``/v1`` (an OpenAI base
    URL: every request would go to ``/v1/v1/...``).

    Raises :class:`EngineURLError` (a ``ValueError``).
    """
    if not isinstance(url, str) or not url:
        raise EngineURLError(url, f"not a URL; {_SHAPE}")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise EngineURLError(url, "contains whitespace or control characters")
    if not url.isascii():
        raise EngineURLError(url, "contains non-ASCII characters (write the host in punycode)")
    if "://" not in url:
        raise EngineURLError(url, f"no scheme; {_SHAPE}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unbalanced IPv6 bracket
        raise EngineURLError(url, f"cannot be parsed ({exc})") from None
    if parts.scheme.lower() != "http":
        raise EngineURLError(
            url, f"scheme {parts.scheme!r} is not supported: engines are reached over plain http://"
        )
    if parts.username is not None or parts.password is not None:
        raise EngineURLError(url, "credentials (user@host) are not supported")
    if not parts.hostname:
        raise EngineURLError(url, f"no host; {_SHAPE}")
    try:
        port = parts.port
    except ValueError:
        port_text = parts.netloc.rpartition(":")[2]
        raise EngineURLError(url, f"port {port_text!r} is not a number in 1..65535") from None
    if port == 0:
        raise EngineURLError(url, "port 0 is not a number in 1..65535")
    if parts.netloc.endswith(":"):
        raise EngineURLError(url, "empty port after ':'")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise EngineURLError(
            url, "a query or fragment is not allowed: the gateway appends the endpoint paths"
        )
    if parts.path.rstrip("/").endswith("/v1"):
        raise EngineURLError(
            url, "give the engine's root, not its OpenAI base URL (drop the trailing /v1)"
        )
    return "http" + url[len(parts.scheme) :].rstrip("/")
