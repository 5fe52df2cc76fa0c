"""`GET /health`, `/metrics`, `/v1/config`, `/v1/models`: what the server is and how it is doing."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from .. import protocol as P
from .common import GUARDED, server_of

router = APIRouter()

# Routes that return plain dicts say `response_model=None`: with a return annotation and no
# response model, FastAPI would start validating and serializing their bodies through pydantic.


@router.get("/health", response_model=None)
async def health(request: Request) -> dict[str, Any]:
    server = server_of(request)
    return {"status": "ok", "model": server.model_name, "running": server.loop.running,
            "queued": server.loop.queue_depth, "steps": server.loop.steps}


@router.get("/metrics", dependencies=GUARDED)
async def metrics(request: Request) -> PlainTextResponse:
    return PlainTextResponse(server_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/config", dependencies=GUARDED, response_model=None)
async def config(request: Request) -> dict[str, Any]:
    server = server_of(request)
    return {**server.settings.report(), "store": str(server.store.root), "served_model": server.model_name,
            "context": server.context}


@router.get("/v1/models", dependencies=GUARDED, response_model=None)
async def models(request: Request) -> dict[str, Any]:
    server = server_of(request)
    return P.models_list(server.model_name, int(server.started))
