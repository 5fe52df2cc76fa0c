"""AICI's `POST /v1/run`: one request streamed as `initial-run`, then `run` objects, then `[DONE]`."""
from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from .. import protocol as P
from .common import GUARDED, read_body, server_of

router = APIRouter(dependencies=GUARDED)


@router.post("/v1/run")
async def run(request: Request) -> StreamingResponse:
    server = server_of(request)
    body = P.parse(P.RunRequest, await read_body(request, 16 << 20))
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
