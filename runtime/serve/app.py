"""`create_app(settings)`: the ASGI application of `aicirt serve` (FastAPI), used by uvicorn and tests.

Routes (docs/server.md has a curl example of each), one module a concern under `routes/`:
AICI's `POST /v1/controllers`, `GET|POST /v1/controllers/tags`, `POST /v1/run`; OpenAI's
`POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`; and `GET /health`,
`GET /metrics`, `GET /v1/config` (the settings and controller limits it runs with), plus
`GET /v1/controllers` and `DELETE /v1/controllers/{name}` for `aicirt ls` and `aicirt rm`.

This module puts them together: the one `Server` (on `app.state`), its start and close, the
per-route response counter, and one place that turns every error into JSON (`protocol.ApiError`),
a 4xx for anything the client got wrong.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import protocol as P
from .metrics import Metrics
from .routes import PATHS, ROUTERS
from .server import Server
from .settings import Settings
from .store import Store

if TYPE_CHECKING:
    from ..engine.backends.base import Backend


def create_app(settings: Settings | None = None, *, backend: Backend | None = None,
               store: Store | None = None) -> FastAPI:
    """The application. `backend` (tests, benchmarks): a model backend to serve instead of loading
    `settings.model`; `store`: a store instead of the one at `settings.store`."""
    settings = settings or Settings()
    server = Server(settings, backend, store)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.loop.start()
        try:
            yield
        finally:
            await run_in_threadpool(server.close)

    app = FastAPI(title="aicirt", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.add_middleware(_CountResponses, metrics=server.metrics)
    _json_errors(app)
    for router in ROUTERS:
        app.include_router(router)
    return app


def _json_errors(app: FastAPI) -> None:
    """Every error as `protocol.ApiError`'s JSON body: ours, Starlette's 404/405, a bad request
    body (400), and anything a handler did not expect (500, with the exception's type)."""
    @app.exception_handler(P.ApiError)
    async def _api_error(request: Request, e: P.ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        msg = {404: f"no route {request.method} {request.url.path}",
               405: f"method {request.method} not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return JSONResponse(P.ApiError(e.status_code, msg).body(), status_code=e.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(P.ApiError(400, str(e)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception) -> JSONResponse:
        return JSONResponse(P.ApiError(500, f"internal error: {type(e).__name__}: {e}").body(), status_code=500)


class _CountResponses:
    """Pure ASGI middleware (streams pass through untouched): responses by route and status."""

    def __init__(self, app: Callable[..., Awaitable[None]], metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        route = path if path in PATHS else ("/v1/controllers/{name}" if path.startswith("/v1/controllers/")
                                            else "other")

        async def counting_send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                self.metrics.inc("aicirt_http_responses_total", route=route, code=msg["status"])
            await send(msg)

        await self.app(scope, receive, counting_send)
