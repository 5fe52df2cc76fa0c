"""OpenAI's `POST /v1/completions` and `/v1/chat/completions`: a whole reply or a stream of chunks,
with structured outputs (`response_format`, `tools`: serve/structured.py) and `logprobs`."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from aicirt.program.tool_stream import ToolStream

from .. import protocol as P
from .. import structured as S
from .common import GUARDED, read_body, server_of

if TYPE_CHECKING:
    from ..server import Server

router = APIRouter(dependencies=GUARDED)


@router.post("/v1/completions", response_model=None)
async def completions(request: Request) -> StreamingResponse | dict[str, Any]:
    return await _openai(request, P.CompletionRequest, chat=False)


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request) -> StreamingResponse | dict[str, Any]:
    return await _openai(request, P.ChatRequest, chat=True)


@dataclass
class _Reply:
    """One accepted request and what its answer is written with."""
    server: Server
    body: Any
    plan: S.Plan
    job: Any
    chat: bool
    cid: str
    created: int
    prompt_len: int
    wants_logprobs: bool
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.server.model_name


async def _openai(request: Request, model: Any, chat: bool) -> StreamingResponse | dict[str, Any]:
    server = server_of(request)
    body = P.parse(model, await read_body(request, 16 << 20))
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
    reply = _Reply(server, body, plan, job, chat, P.new_id("chatcmpl" if chat else "cmpl"), accepted.created,
                   len(job.prompt), job.params.logprobs is not None)
    if not body.stream:
        return await _whole(reply, request)
    return StreamingResponse(_stream(reply), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _whole(r: _Reply, request: Request) -> dict[str, Any]:
    """The reply in one object, once every sequence has finished."""
    backend = r.server.backend
    last = None
    logprobs: dict[int, list] = {}
    async for batch in r.server.updates(r.job, request):
        last = batch[-1]
        for upd in batch:
            for d in upd.forks:
                logprobs.setdefault(d.index, []).extend(d.logprobs)
    if last is None or not last.finished:
        raise P.ApiError(499, "client closed the request")
    forks = []
    for s in r.job.req.sequences:
        text, calls = r.plan.reply(s.text) if r.chat else (s.text, [])
        forks.append({"index": s.label, "text": text, "tool_calls": calls, "finish_reason": s.finish_reason,
                      "error": s.error or "", "logs": "".join(s.logs),
                      "logprobs": P.logprobs_object(backend, logprobs.get(s.label, []), r.chat)
                      if r.wants_logprobs else None})
    return P.completion_response(r.cid, r.created, r.name, forks, r.chat, P.openai_usage(r.prompt_len, last.usage),
                                 r.job.tracker.variables)


class _ToolDeltas:
    """OpenAI's incremental `tool_calls` deltas: each choice's text held and parsed as it grows."""

    def __init__(self, r: _Reply) -> None:
        self.r = r
        self.held: dict[int, str] = {}          # each choice's text so far
        self.held_lp: dict[int, list] = {}      # and its logprobs not sent yet
        self.parsers: dict[int, ToolStream] = {}

    def chunks(self, upd: Any) -> list[bytes]:
        r, backend = self.r, self.r.server.backend
        out = []
        for d in upd.forks:
            text = self.held.get(d.index, "")
            self.held[d.index] = (text[:len(text) - d.backtrack] if d.backtrack else text) + d.text
            self.held_lp.setdefault(d.index, []).extend(d.logprobs)
            ts = self.parsers.get(d.index)
            if ts is None:
                ts = self.parsers[d.index] = ToolStream(r.plan.family)
                out.append(P.sse(P.tool_delta_chunk(r.cid, r.created, r.name, d.index,
                                                    {"role": "assistant", "content": None})))
            done = d.finish_reason is not None
            for piece in ts.feed(self.held[d.index], final=done):
                lp = None
                if r.wants_logprobs and self.held_lp[d.index]:
                    lp = P.logprobs_object(backend, self.held_lp.pop(d.index), True)
                delta = piece if "content" in piece else {"tool_calls": [piece["tool_call"]]}
                out.append(P.sse(P.tool_delta_chunk(r.cid, r.created, r.name, d.index, delta, logprobs=lp)))
            if done:
                lp = P.logprobs_object(backend, self.held_lp.pop(d.index, []), True) if r.wants_logprobs else None
                reason = P.finish_reason(d.finish_reason, [True] * ts.calls) or "stop"
                chunk = P.tool_delta_chunk(r.cid, r.created, r.name, d.index, {}, reason, lp)
                if d.error:
                    chunk["choices"][0]["error"] = d.error
                out.append(P.sse(chunk))
        return out


async def _stream(r: _Reply) -> AsyncIterator[bytes]:
    """The reply as server-sent chunks, then the usage chunk if asked for, then `[DONE]`."""
    backend = r.server.backend
    first, usage = True, None
    tools = _ToolDeltas(r) if r.plan.calls_tools else None
    offsets: dict[int, int] = {}       # completions' text_offset: characters sent per choice
    try:
        async for batch in r.server.updates(r.job):
            chunks = []
            for upd in batch:
                usage = upd.usage
                if tools is not None:
                    chunks += tools.chunks(upd)
                    continue
                lps = None
                if r.wants_logprobs:
                    lps = {}
                    for d in upd.forks:
                        lps[d.index] = P.logprobs_object(backend, d.logprobs, r.chat, offsets.get(d.index, 0))
                        offsets[d.index] = offsets.get(d.index, 0) + len(d.text) - d.backtrack
                chunks.append(P.sse(P.completion_chunk(r.cid, r.created, r.name, upd, r.chat, first, lps)))
                first = False
            if chunks:
                yield b"".join(chunks)
    except P.ApiError as e:
        yield P.sse({"error": {"message": e.message, "type": "server_error", "code": e.status}})
    if r.body.include_usage and usage is not None:
        yield P.sse(P.usage_chunk(r.cid, r.created, r.name, r.chat, P.openai_usage(r.prompt_len, usage)))
    yield P.sse("[DONE]")
