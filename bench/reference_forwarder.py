"""A reference forwarder written the way peers usually write one: FastAPI routes,
uvicorn, one shared ``aiohttp.ClientSession`` with its defaults, round-robin over
the engines. Benchmark-only (``pip install -e .[bench]``); not part of trioforward.

    python bench/reference_forwarder.py --engine http://127.0.0.1:8001 --host 127.0.0.3 --port 9000

It does what such a forwarder typically does and nothing more: parse the JSON,
pick an engine, post it, return the body (or relay the stream). No retries, no
disconnect handling, no capacity limits beyond aiohttp's default connector
(100 connections).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


def build_app(engines: list[str]) -> FastAPI:
    state: dict[str, Any] = {}
    rotation = itertools.cycle(engines)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["session"] = aiohttp.ClientSession()
        yield
        await state["session"].close()

    app = FastAPI(lifespan=lifespan)

    async def forward(path: str, request: Request) -> Response:
        body = await request.json()
        engine = next(rotation)
        session: aiohttp.ClientSession = state["session"]
        if body.get("stream"):
            upstream = await session.post(engine + path, json=body)

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in upstream.content.iter_any():
                        yield chunk
                finally:
                    upstream.release()

            return StreamingResponse(relay(), status_code=upstream.status, media_type="text/event-stream")
        try:
            async with session.post(engine + path, json=body) as upstream:
                content = await upstream.read()
                return Response(content, status_code=upstream.status, media_type=upstream.content_type)
        except aiohttp.ClientError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=502)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward("/v1/chat/completions", request)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", action="append", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args(argv)
    uvicorn.run(build_app(args.engine), host=args.host, port=args.port, log_level="warning", backlog=4096)


if __name__ == "__main__":
    main()
