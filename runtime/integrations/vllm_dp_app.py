"""The front server of `aicirt serve --engine vllm --data-parallel-size N` (`aicirt.integrations.vllm_dp`
has the ranks and why): one FastAPI application that routes each generation request to the
least-loaded rank and relays everything else to rank 0, streaming the rank's answer unchanged.
"""
from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import IO, Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..serve import protocol as P
from ..serve.settings import Settings
from .vllm_dp import Ranks, merge_metrics

#: Routes whose requests generate: routed to the least-loaded rank.
ROUTED = frozenset({"/v1/run", "/v1/completions", "/v1/chat/completions"})
#: Hop-by-hop headers a proxy must not forward (RFC 9110, section 7.6.1), plus those httpx sets itself.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length"})


class _Relayed(StreamingResponse):
    """A rank's response streamed on unchanged. However it ends (done, the client gone, never
    started), the rank's response is closed, so the rank ends that request too, and `release`
    runs once (the request leaves the rank's in-flight count)."""

    def __init__(self, upstream: httpx.Response, release: Callable[[], None], headers: dict[str, str]) -> None:
        super().__init__(upstream.aiter_raw(), status_code=upstream.status_code, headers=headers)
        self._upstream, self._release = upstream, release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            release, self._release = self._release, lambda: None
            release()
            await self._upstream.aclose()


def create_dp_app(settings: Settings) -> FastAPI:
    """The front server's ASGI application: starts `settings.data_parallel_size` ranks (blocking
    until each serves) and routes to them; they end with the application's lifespan (or
    `app.state.ranks.close()` where it never starts)."""
    if settings.engine != "vllm" or settings.data_parallel_size < 2:
        raise ValueError("create_dp_app needs engine = vllm and data_parallel_size >= 2")
    ranks = Ranks(settings)
    ranks.start()
    client: dict[str, httpx.AsyncClient] = {}

    def http() -> httpx.AsyncClient:
        if "c" not in client:
            client["c"] = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0),
                                            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        return client["c"]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if "c" in client:
                await client["c"].aclose()
            await asyncio.get_running_loop().run_in_executor(None, ranks.close)

    app = FastAPI(title="aicirt (data parallel)", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ranks = ranks

    def forward_headers(request: Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() not in _HOP}

    async def send(rank: int, request: Request, path: str) -> httpx.Response:
        req = http().build_request(request.method, ranks.urls[rank] + path, params=request.query_params,
                                   headers=forward_headers(request), content=await request.body())
        return await http().send(req, stream=True)

    def unavailable(rank: int, e: Exception) -> JSONResponse:
        return JSONResponse(P.ApiError(503, f"data-parallel rank {rank} is unreachable: {type(e).__name__}").body(),
                            status_code=503, headers={"x-aicirt-rank": str(rank)})

    async def relay(rank: int, request: Request, path: str, routed: bool) -> Response:
        release = (lambda: ranks.done(rank)) if routed else (lambda: None)
        try:
            upstream = await send(rank, request, path)
        except BaseException as e:
            release()
            if isinstance(e, httpx.TransportError):
                return unavailable(rank, e)
            raise
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        headers["x-aicirt-rank"] = str(rank)
        return _Relayed(upstream, release, headers)

    async def fetch_all(request: Request, path: str) -> list[httpx.Response | Exception]:
        """GET `path` from every rank at once: each rank's response, or what went wrong."""
        async def one(url: str) -> httpx.Response | Exception:
            try:
                return await http().get(url + path, headers=forward_headers(request), timeout=30)
            except httpx.TransportError as e:
                return e
        return list(await asyncio.gather(*(one(u) for u in ranks.urls)))

    @app.get("/health", response_model=None)
    async def health(request: Request) -> Response:
        got = await fetch_all(request, "/health")
        down = [i for i, r in enumerate(got) if not isinstance(r, httpx.Response) or r.status_code != 200]
        if down:
            return JSONResponse(P.ApiError(503, f"data-parallel ranks {down} are not healthy").body(), status_code=503)
        bodies = [r.json() for r in got if isinstance(r, httpx.Response)]
        out = {"status": "ok", "model": bodies[0]["model"], "ranks": bodies,
               **{key: sum(int(b.get(key, 0)) for b in bodies) for key in ("running", "queued", "steps")}}
        return JSONResponse(out)

    @app.get("/metrics", response_model=None)
    async def metrics(request: Request) -> Response:
        got = await fetch_all(request, "/metrics")
        for i, r in enumerate(got):
            if isinstance(r, Exception):
                return unavailable(i, r)
            if r.status_code != 200:
                return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))
        front = {"aicirt_dp_requests_total": ("counter", "Generation requests routed to each data-parallel rank.",
                                              {r: float(n) for r, n in enumerate(ranks.routed)}),
                 "aicirt_dp_in_flight": ("gauge", "Generation requests in flight on each data-parallel rank.",
                                         {r: float(n) for r, n in enumerate(ranks.in_flight)})}
        text = merge_metrics([r.text for r in got if isinstance(r, httpx.Response)], front)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/config", response_model=None)
    async def config(request: Request) -> Response:
        r = (await fetch_all(request, "/v1/config"))[0]
        if isinstance(r, Exception):
            return unavailable(0, r)
        if r.status_code != 200:
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))
        return JSONResponse({**r.json(), "data_parallel_size": settings.data_parallel_size,
                             "port": settings.port, "host": settings.host, "ranks": ranks.urls})

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], response_model=None)
    async def proxy(path: str, request: Request) -> Response:
        path = "/" + path
        if request.method == "POST" and path in ROUTED:
            return await relay(ranks.pick(), request, path, True)
        return await relay(0, request, path, False)

    return app


def serve_dp(settings: Settings, *, log: IO[str] | None = None) -> None:
    """`aicirt serve --engine vllm --data-parallel-size N`: start the ranks, then serve the front
    until interrupted."""
    import uvicorn

    log = log or sys.stderr
    log.write(f"aicirt serve: starting {settings.data_parallel_size} data-parallel vLLM ranks ...\n")
    log.flush()
    app = create_dp_app(settings)
    log.write(f"aicirt serve: ranks at {', '.join(app.state.ranks.urls)}; listening on "
              f"http://{settings.host}:{settings.port}\n")
    log.flush()
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        app.state.ranks.close()      # also where the front never started (its port taken)
