"""A tiny h11 client over raw trio sockets, for tests of the simulated engine.

(Not trioforward.http: the engine's tests must not depend on the pool under test.)
"""

from __future__ import annotations

from typing import Any

import h11
import orjson
import trio

from trioforward.sim import SimEngine


class Reply:
    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = {k.decode().lower(): v.decode() for k, v in headers}
        self.body = body

    def json(self) -> Any:
        return orjson.loads(self.body)


class Conn:
    """One keep-alive client connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, engine: SimEngine) -> Conn:
        return cls(await trio.open_tcp_stream("127.0.0.1", engine.port))

    async def send(
        self, method: str, path: str, json: Any = None, headers: list[tuple[str, str]] | None = None
    ) -> None:
        body = b"" if json is None else orjson.dumps(json)
        hdrs = [("host", "127.0.0.1"), ("content-length", str(len(body))), *(headers or [])]
        if json is not None:
            hdrs.append(("content-type", "application/json"))
        data = self.h11.send(h11.Request(method=method, target=path, headers=hdrs)) or b""
        data += (self.h11.send(h11.Data(data=body)) or b"") if body else b""
        data += self.h11.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(data)

    async def _event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(65536))
                continue
            return event

    async def head(self) -> h11.Response:
        event = await self._event()
        assert isinstance(event, h11.Response), event
        return event

    async def body(self) -> bytes:
        parts = []
        while True:
            event = await self._event()
            if isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            assert isinstance(event, h11.Data), event
            parts.append(event.data)

    async def response(self) -> Reply:
        head = await self.head()
        body = await self.body()
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        return Reply(head.status_code, list(head.headers), body)

    async def request(
        self, method: str, path: str, json: Any = None, headers: list[tuple[str, str]] | None = None
    ) -> Reply:
        await self.send(method, path, json, headers)
        return await self.response()

    async def at_eof(self) -> bool:
        """True if the server closed (EOF or reset) with no more bytes."""
        try:
            return await self.stream.receive_some(65536) == b""
        except trio.BrokenResourceError:
            return True

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> Conn:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def request(engine: SimEngine, method: str, path: str, json: Any = None) -> Reply:
    """One request on a fresh connection."""
    async with await Conn.open(engine) as conn:
        return await conn.request(method, path, json)
