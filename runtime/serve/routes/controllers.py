"""The controller store over HTTP: upload, list, tag, remove (`aicirt upload|tags|ls|rm --server`)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from .. import protocol as P
from ..store import StoreError
from .common import GUARDED, read_body, server_of, user_of

router = APIRouter(dependencies=GUARDED)


@router.post("/v1/controllers", response_model=None)
async def upload(request: Request) -> dict[str, Any]:
    server = server_of(request)
    data = await read_body(request, server.settings.max_upload_bytes)
    user = user_of(request)
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


@router.get("/v1/controllers", response_model=None)
async def list_modules(request: Request) -> dict[str, Any]:
    mods = await run_in_threadpool(server_of(request).store.modules)
    return {"modules": [m.as_dict() for m in mods]}


@router.get("/v1/controllers/tags", response_model=None)
async def list_tags(request: Request) -> dict[str, Any]:
    tags = await run_in_threadpool(server_of(request).store.tags)
    return {"tags": [t.as_dict() for t in tags]}


@router.post("/v1/controllers/tags", response_model=None)
async def tag(request: Request) -> dict[str, Any]:
    server = server_of(request)
    body = P.parse(P.TagRequest, await read_body(request, 1 << 20))
    try:
        infos = await run_in_threadpool(server.store.tag, body.module_id, body.tags, user=user_of(request))
    except StoreError as e:
        raise P.ApiError(e.status, str(e)) from None
    return {"tags": [t.as_dict() for t in infos]}


@router.delete("/v1/controllers/{name}", response_model=None)
async def remove(name: str, request: Request) -> dict[str, Any]:
    server = server_of(request)
    try:
        gone = await run_in_threadpool(server.store.remove, name)
    except StoreError as e:
        raise P.ApiError(e.status, str(e)) from None
    with server._lock:
        server._controllers.clear()
    return {"removed": gone.as_dict()}
