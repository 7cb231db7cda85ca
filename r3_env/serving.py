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


def install_common(
    app: FastAPI, api_key: str, max_body_bytes: int, requests, latency, registry
) -> Callable[[Request], None]:
    """Body-size limit (413), request metrics, and ``GET /metrics``; returns the auth dependency.

    ``requests`` is a Prometheus counter labelled (endpoint, status), ``latency`` a histogram
    labelled (endpoint), both in ``registry``, which ``/metrics`` renders.
    """
    from prometheus_client import generate_latest

    authorize = bearer_auth(api_key)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        begin = time.perf_counter()
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            response = JSONResponse(
                status_code=413,
                content={
                    "detail": f"request body of {length} bytes exceeds max_body_bytes={max_body_bytes}; "
                    "send fewer or shorter items per request"
                },
            )
        else:
            response = await call_next(request)
        requests.labels(request.url.path, str(response.status_code)).inc()
        latency.labels(request.url.path).observe(time.perf_counter() - begin)
        return response

    @app.get("/metrics", dependencies=[Depends(authorize)])
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry), media_type="text/plain; version=0.0.4")

    return authorize


def serve(app: FastAPI, host: str, port: int) -> None:
    """Run ``app`` with uvicorn until interrupted (quiet access log: the metrics count requests)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
