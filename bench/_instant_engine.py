"""An instant HTTP/1.1 "engine" for the pool CPU benchmark (bench/pool_cpu.py).

Answers every request at once with a small fixed JSON completion, keep-alive,
on several loopback addresses (``--hosts 127.0.0.2,127.0.0.3,...``) so each
benchmark run gets its own destination address and the ~28k ephemeral ports
(and their TIME_WAIT) of one address are never exhausted. Plain asyncio
protocols and a hand-rolled request scanner: it only has to keep up, not be
general (requests must carry Content-Length, which every client measured does
for a POST body). Prints ``{"addresses": [[host, port], ...]}`` once listening.

Run: ``python bench/_instant_engine.py --hosts 127.0.0.2,127.0.0.3``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys

COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "sim-base",
        "choices": [
            {"index": 0, "text": " ok", "logprobs": None, "finish_reason": "length", "stop_reason": None}
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
    },
    separators=(",", ":"),
).encode()
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    % len(COMPLETION)
    + COMPLETION
)


class _Engine(asyncio.Protocol):
    __slots__ = ("transport", "buffer")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        answers = 0
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end].lower()
            at = head.find(b"\ncontent-length:")
            length = 0
            if at >= 0:
                stop = head.find(b"\r", at + 16)
                length = int(head[at + 16 : stop if stop >= 0 else None])
            total = end + 4 + length
            if len(buffer) < total:
                break
            buffer = buffer[total:]
            answers += 1
        self.buffer = buffer
        if answers:
            self.transport.write(RESPONSE * answers)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self.buffer = b""


async def _serve(hosts: list[str]) -> None:
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(_Engine, host, 0, backlog=65535, reuse_address=True)
        for host in hosts
    ]
    addresses = [list(s.sockets[0].getsockname()[:2]) for s in servers]
    print(json.dumps({"addresses": addresses}), flush=True)
    # Serve until the parent closes our stdin.
    await loop.run_in_executor(None, sys.stdin.read)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="127.0.0.2", help="comma-separated loopback addresses")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(_serve(args.hosts.split(",")))


if __name__ == "__main__":
    main()
