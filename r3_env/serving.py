"""What every r3rag HTTP service shares: bearer-token auth, a body-size limit, request metrics, serving.

The retrieval service and the reward server both build on these, so they answer auth and size
errors the same way and expose the same request counters.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse


def bearer_auth(api_key: str) -> Callable[[Request], None]:
    """A FastAPI dependency that requires ``Authorization: Bearer <api_key>`` (no-op when the key is empty)."""

    def authorize(request: Request) -> None:
        if not api_key:
            return
        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise HTTPException(
                status_code=401,
                detail="missing or wrong bearer token (Authorization: Bearer KEY)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return authorize


class BodyLimit:
    """ASGI middleware: answer 413 to a request body over ``max_bytes``, declared or streamed (chunked)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(send, int(declared))
        messages, size = [], 0
        while True:  # buffer the body (bounded by max_bytes), then replay it to the app
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self._reject(send, size)
            if not message.get("more_body", False):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send, size: int) -> None:
        response = JSONResponse(
            status_code=413,
            content={
                "detail": f"request body of {size}+ bytes exceeds max_body_bytes={self.max_bytes}; "
                "send fewer or shorter items per request"
            },
        )
        await response({"type": "http"}, None, send)


class Measure:
    """ASGI middleware counting requests by (route, status) and timing them (no per-request task overhead)."""

    def __init__(self, app, requests, latency) -> None:
        self.app, self.requests, self.latency = app, requests, latency

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        begin, status = time.perf_counter(), 500

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            endpoint = getattr(scope.get("route"), "path", "other")
            self.requests.labels(endpoint, str(status)).inc()
            self.latency.labels(endpoint).observe(time.perf_counter() - begin)


def install_common(
    app: FastAPI, api_key: str, max_body_bytes: int, requests, latency, registry
) -> Callable[[Request], None]:
    """Body-size limit (413), request metrics, and ``GET /metrics``; returns the auth dependency.

    ``requests`` is a Prometheus counter labelled (endpoint, status), ``latency`` a histogram
    labelled (endpoint), both in ``registry``, which ``/metrics`` renders. Endpoints are labelled
    by their route (unknown paths as "other"), so stray URLs cannot grow the series without bound.
    """
    from prometheus_client import generate_latest

    authorize = bearer_auth(api_key)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(Measure, requests=requests, latency=latency)

    @app.get("/metrics", dependencies=[Depends(authorize)])
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry), media_type="text/plain; version=0.0.4")

    return authorize


def serve(app: FastAPI, host: str, port: int) -> None:
    """Run ``app`` with uvicorn until interrupted (quiet access log: the metrics count requests)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
