"""HTTP/1.0 and ``Connection: close`` on every route: the gateway closes the
connection right after the answer (``_tcpserver.KeepAliveTCPServer._close``).

Found with monitoring probes: the Quart routes answered HTTP/1.0 GETs completely,
saying ``Connection: close``, but the socket stayed open (no EOF, two descriptors
held per probe) until the client left: the close ran in the app's task as Quart
cancelled it, and its first checkpoint raised before the socket was closed.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import trio
from gateway_harness import open_gateway

GETS = ["/health", "/livez", "/readyz", "/metrics", "/admin/engines", "/v1/models", "/admin/adapters"]
POSTS = ["/v1/completions", "/v1/chat/completions"]
BODIES = {
    "/v1/completions": b'{"model": "sim-base", "prompt": "hi", "max_tokens": 2}',
    "/v1/chat/completions": b'{"model": "sim-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
}


def _request(method: str, path: str, version: str) -> bytes:
    close = b"Connection: close\r\n" if version == "1.1" else b""
    head = f"{method} {path} HTTP/{version}\r\nHost: x\r\n".encode() + close
    body = BODIES.get(path, b"")
    if method == "POST":
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return head + b"\r\n" + body


async def _probe(port: int, data: bytes) -> bytes:
    """Sends ``data`` and reads until the gateway closes (never closes first)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(data)
        received = b""
        with trio.fail_after(120):  # a hang guard: the keep-alive is an hour
            while chunk := await stream.receive_some(65536):
                received += chunk
        return received
    finally:
        await stream.aclose()


def _sockets(port: int, *, listener: bool = False) -> int:
    """This process's TCP sockets with ``port`` at either end (the listening one
    only if ``listener``), from /proc/net/tcp{,6} and /proc/self/fd."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                ports = {int(local.rpartition(":")[2], 16), int(remote.rpartition(":")[2], 16)}
                if port in ports and inode in inodes and (listener or state != "0A"):  # 0A: LISTEN
                    count += 1
    return count


def _fds_apart_from(engine_port: int) -> int:
    """Descriptors of this process but the sockets to and of the simulated engine
    (the gateway's pool keeps as many upstream connections as a burst needed)."""
    return len(os.listdir("/proc/self/fd")) - _sockets(engine_port, listener=True)


async def _hog(share: float) -> None:
    """Keeps the gateway's trio loop busy: ``share`` of each 50 ms on the CPU."""
    while True:
        until = time.perf_counter() + 0.05 * share
        while time.perf_counter() < until:
            pass
        await trio.sleep(0.05 * (1 - share))


@pytest.mark.parametrize("version", ["1.0", "1.1"], ids=["http-1.0", "connection-close"])
async def test_every_route_closes_right_after_a_must_close_answer_under_load(
    engine: Any, version: str
) -> None:
    probes = [("GET", p) for p in GETS] + [("POST", p) for p in POSTS]
    # No engine health probes: a probe's connect in flight (its socket open, not yet
    # in /proc/net/tcp while the address is resolved) is a descriptor the count would
    # see, and not the gateway's answer to these probes.
    async with open_gateway(engine.url, keep_alive=3600.0, health_interval=0) as gw:
        port = int(gw.url.rpartition(":")[2])

        async def round_of_probes(times: int) -> None:
            async def one(method: str, path: str) -> None:
                raw = await _probe(port, _request(method, path, version))
                head, _, body = raw.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), (path, raw[:200])
                assert b"connection: close" in head.lower(), (path, head)
                length = [line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
                assert not length or int(length[0].partition(b":")[2]) == len(body), (path, raw[:200])

            async with trio.open_nursery() as nursery:
                for _ in range(times):
                    for method, path in probes:
                        nursery.start_soon(one, method, path)

        await round_of_probes(1)  # warm-up: the pool's upstream connections to the engine
        await trio.testing.wait_all_tasks_blocked()
        engine_port = int(engine.url.rpartition(":")[2])
        baseline = _fds_apart_from(engine_port)
        async with trio.open_nursery() as load:
            load.start_soon(_hog, 0.8)
            await round_of_probes(20)
            load.cancel_scope.cancel()
        # Every answer ended with the gateway's close (the probes wait for EOF), and
        # the gateway holds no socket of those connections nor any extra descriptor.
        await trio.testing.wait_all_tasks_blocked()
        assert _sockets(port) == 0
        # The leak this guards against is for good (two descriptors per probe until
        # the client leaves).
        assert _fds_apart_from(engine_port) <= baseline
        assert await gw.pool_active() == 0
