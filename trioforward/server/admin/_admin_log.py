"""One log line per admin change (docs/server.md, "Logs").

Pauses, resumes, engines added or removed and adapters registered change what
every trainer gets; an operator reading the log after a bad run must see when
each happened, who was refused, and how long a pause took to take hold. Reads
(``GET``) are not logged. The body is logged as one line (``ascii``: no control
character or newline from a client can forge a line), cut at 512 bytes; the
credentials of any URL in it (``scheme://user:password@``, which the engine
routes refuse) are replaced by ``***`` first, so a refused call leaves no
password in the log.
"""

from __future__ import annotations

import logging
import re

import trio
from quart import Response, g, request
from quart_trio import QuartTrio

__all__ = ["install_admin_log"]

admin_log = logging.getLogger("trioforward.admin")

_BODY_LOGGED = 512  # bytes of the body in the line
_READ_AT_MOST = 65536  # bytes: a larger body is not read for the log
# The userinfo of a URL, written plainly or percent-encoded (a query string):
# ``://`` or ``%3A%2F%2F``, then anything up to ``@`` (or ``%40``) with no slash.
_USERINFO = re.compile(r"(://|%3A%2F%2F)[^/@\s\"']*?(@|%40)", re.IGNORECASE)


def install_admin_log(app: QuartTrio) -> None:
    """Log ``METHOD PATH STATUS SECONDSs body=...`` on ``trioforward.admin`` (INFO)
    for every non-GET ``/admin/*`` request, whatever its answer (401 and 400 too)."""

    @app.before_request
    async def _admin_started() -> None:
        if _is_change():
            g.admin_started = trio.current_time()

    @app.after_request
    async def _admin_done(response: Response) -> Response:
        if _is_change() and admin_log.isEnabledFor(logging.INFO):
            started = g.get("admin_started")
            took = trio.current_time() - started if started is not None else 0.0
            text = await _body_text()
            target = request.path
            if request.query_string:
                target += "?" + _redacted(request.query_string.decode("latin-1"))
            admin_log.info(
                "%s %s %d %.3fs body=%s",
                request.method,
                ascii(target)[1:-1],
                response.status_code,
                took,
                text if text == "-" else ascii(text),
            )
        return response


async def _body_text() -> str:
    """The request body for the log: read only when it is small and declared (a
    refused 64 MiB body is not read again to be logged)."""
    size = request.content_length
    if not size and "transfer-encoding" not in request.headers:
        return "-"  # no body
    if size is None or size > _READ_AT_MOST:
        return f"({size if size is not None else 'undeclared'} bytes, not logged)"
    try:
        data = await request.get_data(as_text=False)
    except Exception:  # the body could not be read (the client went away)
        return f"({size} bytes, unread)"
    body = data if isinstance(data, bytes) else data.encode()
    text = _redacted(body[:_BODY_LOGGED].decode("utf-8", "replace"))
    return text + f"... ({len(body)} bytes)" if len(body) > _BODY_LOGGED else text


def _is_change() -> bool:
    return request.path.startswith("/admin/") and request.method not in ("GET", "HEAD")


def _redacted(text: str) -> str:
    """``text`` with every URL's ``user:password@`` replaced by ``***@``."""
    return _USERINFO.sub(lambda m: f"{m[1]}***{m[2]}", text)
