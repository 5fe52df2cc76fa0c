"""`create_app(settings)`: the ASGI application of `aicirt serve` (FastAPI), used by uvicorn and tests.

Routes (docs/server.md has a curl example of each): AICI's `POST /v1/controllers`,
`GET|POST /v1/controllers/tags`, `POST /v1/run`; OpenAI's `POST /v1/completions`,
`POST /v1/chat/completions`, `GET /v1/models`; and `GET /health`, `GET /metrics`, `GET /v1/config`
(the settings and controller limits it runs with), plus
`GET /v1/controllers` and `DELETE /v1/controllers/{name}` for `aicirt ls` and `aicirt rm`.

Handlers never touch the engine: they validate, resolve the controller, tokenize (in a worker
thread), hand a `Job` to the engine loop and stream what it posts back. Every error is JSON
(`protocol.ApiError`), a 4xx for anything the client got wrong.
"""
from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from aicirt.program.tool_stream import ToolStream

from . import protocol as P
from . import structured as S
from .metrics import Metrics
from .server import Server
from .settings import Settings
from .store import Store, StoreError, default_user

if TYPE_CHECKING:
    from ..engine.backends.base import Backend

# Routes that return plain dicts say `response_model=None`: with a return annotation and no
# response model, FastAPI would start validating and serializing their bodies through pydantic.

_ROUTES = {"/v1/controllers", "/v1/controllers/tags", "/v1/run", "/v1/completions", "/v1/chat/completions",
           "/v1/models", "/v1/config", "/health", "/metrics"}


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

    def auth(request: Request) -> None:
        key = settings.api_key
        if not key:
            return
        given = request.headers.get("api-key") or ""
        bearer = request.headers.get("authorization") or ""
        if bearer.lower().startswith("bearer "):
            given = given or bearer[7:].strip()
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise P.ApiError(401, "missing or wrong API key (header `api-key: KEY` or `Authorization: Bearer KEY`)")

    guarded = [Depends(auth)]

    # --- health and metrics ----------------------------------------------------------------
    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": server.model_name, "running": server.loop.running,
                "queued": server.loop.queue_depth, "steps": server.loop.steps}

    @app.get("/metrics", dependencies=guarded)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(server.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/config", dependencies=guarded, response_model=None)
    async def config() -> dict[str, Any]:
        return {**settings.report(), "store": str(server.store.root), "served_model": server.model_name,
                "context": server.context}

    @app.get("/v1/models", dependencies=guarded, response_model=None)
    async def models() -> dict[str, Any]:
        return P.models_list(server.model_name, int(server.started))

    # --- the store -------------------------------------------------------------------------
    @app.post("/v1/controllers", dependencies=guarded, response_model=None)
    async def upload(request: Request) -> dict[str, Any]:
        data = await _read_body(request, settings.max_upload_bytes)
        user = _user(request)
        from aicirt import LoadError

        try:
            up = await run_in_threadpool(server.store.put, data, user=user)
        except StoreError as e:
            server.metrics.inc("aicirt_uploads_total", outcome="rejected")
            raise P.ApiError(e.status, str(e)) from None
        except LoadError as e:
            server.metrics.inc("aicirt_uploads_total", outcome="rejected")
            raise P.ApiError(400, f"not a controller the runtime accepts: {e}") from None
        server.metrics.inc("aicirt_uploads_total", outcome="ok")
        return {"module_id": up.module_id, "wasm_size": up.wasm_size, "compiled_size": up.compiled_size,
                "time": up.time}

    @app.get("/v1/controllers", dependencies=guarded, response_model=None)
    async def list_modules() -> dict[str, Any]:
        mods = await run_in_threadpool(server.store.modules)
        return {"modules": [m.as_dict() for m in mods]}

    @app.get("/v1/controllers/tags", dependencies=guarded, response_model=None)
    async def list_tags() -> dict[str, Any]:
        tags = await run_in_threadpool(server.store.tags)
        return {"tags": [t.as_dict() for t in tags]}

    @app.post("/v1/controllers/tags", dependencies=guarded, response_model=None)
    async def tag(request: Request) -> dict[str, Any]:
        body = P.parse(P.TagRequest, await _read_body(request, 1 << 20))
        try:
            infos = await run_in_threadpool(server.store.tag, body.module_id, body.tags, user=_user(request))
        except StoreError as e:
            raise P.ApiError(e.status, str(e)) from None
        return {"tags": [t.as_dict() for t in infos]}

    @app.delete("/v1/controllers/{name}", dependencies=guarded, response_model=None)
    async def remove(name: str) -> dict[str, Any]:
        try:
            gone = await run_in_threadpool(server.store.remove, name)
        except StoreError as e:
            raise P.ApiError(e.status, str(e)) from None
        with server._lock:
            server._controllers.clear()
        return {"removed": gone.as_dict()}

    # --- AICI's run ------------------------------------------------------------------------
    @app.post("/v1/run", dependencies=guarded)
    async def run(request: Request) -> StreamingResponse:
        body = P.parse(P.RunRequest, await _read_body(request, 16 << 20))
        job = await run_in_threadpool(
            server.prepare, body, lambda: server.backend.format_prompt(body.prompt, chat=body.chat), 0.0)
        accepted = await server.start(job, request)
        run_id = P.new_id("run")

        async def stream() -> AsyncIterator[bytes]:
            yield P.sse(P.initial_run(run_id, accepted.created, server.model_name))
            try:
                async for batch in server.updates(job):
                    yield b"".join(P.sse(P.run_object(upd)) for upd in batch)
            except P.ApiError as e:
                yield P.sse({"object": "run", "forks": [{"index": 0, "text": "", "error": e.message, "logs": "",
                                                        "storage": [], "micros": 0, "finish_reason": "fail"}],
                             "usage": {"sampled_tokens": 0, "ff_tokens": 0, "cost": 0}})
            yield P.sse("[DONE]")

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # --- OpenAI's completions --------------------------------------------------------------
    async def openai(request: Request, model: Any, chat: bool) -> StreamingResponse | dict[str, Any]:
        body = P.parse(model, await _read_body(request, 16 << 20))
        body.check_unsupported()
        plan = S.plan(body, P.chat_template(server.backend) if chat else None)
        if chat:
            if body.max_completion_tokens is not None:
                body.max_tokens = body.max_completion_tokens
            S.check_call_budget(plan, body.max_tokens, server.backend.encode)
            # tool_choice "none" shows the tools as vLLM (>= 0.10) does: the model sees them, no
            # call is constrained or parsed (docs/tools.md)
            shown = plan.tools or None
            tokens = lambda: P.chat_tokens(server.backend, body.messages, shown, plan.family)  # noqa: E731
        else:
            tokens = lambda: server.backend.encode(body.text)  # noqa: E731
        program = plan.controller() if plan.needs_program else None
        job = await run_in_threadpool(server.prepare, body, tokens, 1.0, program)
        accepted = await server.start(job, request)
        cid, created, name = P.new_id("chatcmpl" if chat else "cmpl"), accepted.created, server.model_name
        prompt_len = len(job.prompt)
        wants_logprobs = job.params.logprobs is not None
        backend = server.backend
        if not body.stream:
            last = None
            logprobs: dict[int, list] = {}
            async for batch in server.updates(job, request):
                last = batch[-1]
                for upd in batch:
                    for d in upd.forks:
                        logprobs.setdefault(d.index, []).extend(d.logprobs)
            if last is None or not last.finished:
                raise P.ApiError(499, "client closed the request")
            forks = []
            for s in job.req.sequences:
                text, calls = plan.reply(s.text) if chat else (s.text, [])
                forks.append({"index": s.label, "text": text, "tool_calls": calls, "finish_reason": s.finish_reason,
                              "error": s.error or "", "logs": "".join(s.logs),
                              "logprobs": P.logprobs_object(backend, logprobs.get(s.label, []), chat)
                              if wants_logprobs else None})
            return P.completion_response(cid, created, name, forks, chat, P.openai_usage(prompt_len, last.usage),
                                         job.tracker.variables)

        async def stream() -> AsyncIterator[bytes]:
            first, usage = True, None
            held: dict[int, str] = {}          # tool calling: each choice's text so far
            held_lp: dict[int, list] = {}      # and its logprobs not sent yet
            parsers: dict[int, ToolStream] = {}
            offsets: dict[int, int] = {}       # completions' text_offset: characters sent per choice
            try:
                async for batch in server.updates(job):
                    chunks = []
                    for upd in batch:
                        usage = upd.usage
                        if plan.calls_tools:     # OpenAI's incremental tool_calls deltas
                            for d in upd.forks:
                                text = held.get(d.index, "")
                                held[d.index] = (text[:len(text) - d.backtrack] if d.backtrack else text) + d.text
                                held_lp.setdefault(d.index, []).extend(d.logprobs)
                                ts = parsers.get(d.index)
                                if ts is None:
                                    ts = parsers[d.index] = ToolStream(plan.family)
                                    chunks.append(P.sse(P.tool_delta_chunk(cid, created, name, d.index,
                                                                           {"role": "assistant", "content": None})))
                                done = d.finish_reason is not None
                                for piece in ts.feed(held[d.index], final=done):
                                    lp = None
                                    if wants_logprobs and held_lp[d.index]:
                                        lp = P.logprobs_object(backend, held_lp.pop(d.index), True)
                                    delta = piece if "content" in piece else {"tool_calls": [piece["tool_call"]]}
                                    chunks.append(P.sse(P.tool_delta_chunk(cid, created, name, d.index, delta,
                                                                           logprobs=lp)))
                                if done:
                                    lp = P.logprobs_object(backend, held_lp.pop(d.index, []), True) \
                                        if wants_logprobs else None
                                    reason = P.finish_reason(d.finish_reason, [True] * ts.calls) or "stop"
                                    chunk = P.tool_delta_chunk(cid, created, name, d.index, {}, reason, lp)
                                    if d.error:
                                        chunk["choices"][0]["error"] = d.error
                                    chunks.append(P.sse(chunk))
                            continue
                        lps = None
                        if wants_logprobs:
                            lps = {}
                            for d in upd.forks:
                                lps[d.index] = P.logprobs_object(backend, d.logprobs, chat, offsets.get(d.index, 0))
                                offsets[d.index] = offsets.get(d.index, 0) + len(d.text) - d.backtrack
                        chunks.append(P.sse(P.completion_chunk(cid, created, name, upd, chat, first, lps)))
                        first = False
                    if chunks:
                        yield b"".join(chunks)
            except P.ApiError as e:
                yield P.sse({"error": {"message": e.message, "type": "server_error", "code": e.status}})
            if body.include_usage and usage is not None:
                yield P.sse(P.usage_chunk(cid, created, name, chat, P.openai_usage(prompt_len, usage)))
            yield P.sse("[DONE]")

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/completions", dependencies=guarded, response_model=None)
    async def completions(request: Request) -> StreamingResponse | dict[str, Any]:
        return await openai(request, P.CompletionRequest, chat=False)

    @app.post("/v1/chat/completions", dependencies=guarded, response_model=None)
    async def chat_completions(request: Request) -> StreamingResponse | dict[str, Any]:
        return await openai(request, P.ChatRequest, chat=True)

    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past `limit` bytes (before reading it all when the length is declared)."""
    declared = request.headers.get("content-length")
    # isascii: str.isdigit() also holds for '²' (Latin-1 0xB2), which int() refuses
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise P.ApiError(413, f"body of {declared} bytes is over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise P.ApiError(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _user(request: Request) -> str:
    """Who to record as having uploaded or tagged: the client's `x-aicirt-user`, else the server's user."""
    name = request.headers.get("x-aicirt-user", "").strip()
    if name and len(name) <= 64 and name.isprintable():
        return name
    return default_user()


class _CountResponses:
    """Pure ASGI middleware (streams pass through untouched): responses by route and status."""

    def __init__(self, app: Callable[..., Awaitable[None]], metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        route = path if path in _ROUTES else ("/v1/controllers/{name}" if path.startswith("/v1/controllers/")
                                              else "other")

        async def counting_send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                self.metrics.inc("aicirt_http_responses_total", route=route, code=msg["status"])
            await send(msg)

        await self.app(scope, receive, counting_send)
