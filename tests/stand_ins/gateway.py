"""A stand-in for a serving gateway in front of a real engine: it wants a bearer key, forwards /health and
/v1/... (streaming included) to the engine, and has no /metrics (like the public gateway, docs/cluster.md).
Runs uvicorn in a thread on 127.0.0.1."""

from __future__ import annotations

import secrets
import socket
import threading
import time

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def gateway_app(upstream: str, api_key: str) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(300.0))

    async def forward(request: Request) -> Response:
        path = request.url.path
        if path != "/health" and not path.startswith("/v1/"):
            return JSONResponse({"error": f"{path} is not served by the gateway"}, status_code=404)
        if not secrets.compare_digest(request.headers.get("authorization", ""), f"Bearer {api_key}"):
            return JSONResponse({"error": "invalid or missing API key"}, status_code=401)
        upstream_request = client.build_request(
            request.method,
            path,
            params=request.query_params,
            content=await request.body(),
            headers={"content-type": request.headers.get("content-type", "application/json")},
        )
        response = await client.send(upstream_request, stream=True)
        return StreamingResponse(
            response.aiter_raw(),
            status_code=response.status_code,
            media_type=response.headers.get("content-type"),
            background=None,
        )

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


class Gateway:
    def __init__(self, upstream: str, api_key: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            gateway_app(upstream, api_key), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Gateway:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("gateway stand-in did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
