"""A stand-in for a serving gateway in front of a real engine: it wants a bearer key (or any other whole
Authorization value, e.g. Basic for a URL's user:password), forwards /health and /v1/... (streaming included)
to the engine, and has no /metrics (like the public gateway, docs/cluster.md) unless asked to forward it.
It counts the requests it let through and lists those it refused. Runs uvicorn in a thread on 127.0.0.1."""

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


def gateway_app(
    upstream: str, authorization: str, *, metrics: bool = False, seen: Gateway | None = None
) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(300.0))

    async def forward(request: Request) -> Response:
        path = request.url.path
        if path != "/health" and not path.startswith("/v1/") and not (metrics and path == "/metrics"):
            return JSONResponse({"error": f"{path} is not served by the gateway"}, status_code=404)
        if not secrets.compare_digest(request.headers.get("authorization", ""), authorization):
            if seen is not None:
                seen.refused.append(f"{request.method} {path}")
            return JSONResponse({"error": "invalid or missing credentials"}, status_code=401)
        if seen is not None:
            seen.authorized += 1
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
    """`api_key`: the bearer key it wants; or `authorization`: the whole header value. `metrics`: forward
    /metrics too. `authorized` counts the requests let through, `refused` lists the others."""

    def __init__(
        self,
        upstream: str,
        api_key: str | None = None,
        *,
        authorization: str | None = None,
        metrics: bool = False,
    ) -> None:
        if (api_key is None) == (authorization is None):
            raise ValueError("give api_key or authorization")
        self.authorized = 0
        self.refused: list[str] = []
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            gateway_app(upstream, authorization or f"Bearer {api_key}", metrics=metrics, seen=self),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
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
