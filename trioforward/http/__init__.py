"""trioforward.http: an HTTP/1.1 keep-alive connection pool on h11 and trio.

::

    async with trioforward.http.open_pool(max_connections=256) as pool:
        response = await pool.request("POST", "http://127.0.0.1:8000/v1/completions",
                                      headers=[(b"content-type", b"application/json")],
                                      content=body, deadline=trio.current_time() + 600)
        async with pool.stream("POST", url, content=body) as streamed:
            async for chunk in streamed.aiter_bytes():
                ...

Every failure is a :class:`PoolError` carrying ``.phase``, ``.reused`` and
``.response_bytes`` (docs/pool.md).
"""

from __future__ import annotations

from trioforward.http._errors import (
    ConnectError,
    ConnectTimeout,
    Phase,
    PoolError,
    PoolTimeout,
    RemoteProtocolError,
)
from trioforward.http._models import PoolStatistics, Response
from trioforward.http._pool import ConnectionPool, open_pool
from trioforward.http._stream import StreamContext, StreamResponse

__all__ = [
    "open_pool",
    "ConnectionPool",
    "Response",
    "StreamResponse",
    "StreamContext",
    "PoolStatistics",
    "Phase",
    "PoolError",
    "ConnectError",
    "ConnectTimeout",
    "RemoteProtocolError",
    "PoolTimeout",
]
