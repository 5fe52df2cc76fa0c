"""The wire formats: request models (validated with pydantic, strict types) and response shapes.

AICI's REST API (`/v1/controllers`, `/v1/controllers/tags`, `/v1/run`; its docs/REST.md and its
client `pyaici/rest.py`) and OpenAI's (`/v1/completions`, `/v1/chat/completions`, `/v1/models`).
Extensions, all optional and ignored by stock clients: `controller`/`controller_arg`/`seed`
on OpenAI requests; `seed` and `chat` on `/v1/run`; per fork or choice `backtrack` (characters
of the text streamed so far that a controller took back) and, on OpenAI choices, `logs` and
`error`. See docs/server.md.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aicirt.engine import SamplingParams

from .tracker import ForkDelta, Update, Usage

# --- errors ------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error answered as JSON: `{"message": ..., "error": {"message", "type", "code"}}` (AICI's
    client reads `message`, OpenAI's `error.message`)."""

    def __init__(self, status: int, message: str, *, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    def body(self) -> dict:
        kind = ("invalid_request_error" if self.status < 500 else
                "overloaded_error" if self.status == 503 else "server_error")
        return {"message": self.message, "error": {"message": self.message, "type": kind, "code": self.status}}


def validation_message(e: ValidationError) -> str:
    """One line naming each bad field: `max_tokens: Input should be greater than or equal to 1`."""
    parts = []
    for err in e.errors(include_url=False):
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


#: JSON nested deeper than this is refused: Python's decoder would hit its recursion limit a little
#: further on (a 500), `controller_arg` is encoded again later, and no request needs more.
MAX_JSON_DEPTH = 128


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON (nor are NaN and Infinity)")


def _text_problem(data: object) -> str | None:
    """Where parsed JSON nests deeper than MAX_JSON_DEPTH or holds a string that is not Unicode
    text (a lone surrogate, from an escape such as `\\udcff`: it cannot be encoded for the model
    or the controller), else None. Iterative: the depth is what it checks."""
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            bad = _surrogate(value)
            if bad is not None:
                return f"{where or 'body'}: the string holds a lone surrogate \\u{bad:04x} (not Unicode text)"
        elif isinstance(value, (dict, list)):
            if depth == MAX_JSON_DEPTH:
                return f"{where or 'body'}: nested deeper than {MAX_JSON_DEPTH} levels"
            for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
                path = f"{where}.{key}" if where else str(key)
                bad = _surrogate(key) if isinstance(key, str) else None
                if bad is not None:
                    return f"{where or 'body'}: a key holds a lone surrogate \\u{bad:04x} (not Unicode text)"
                stack.append((item, path[:200], depth + 1))
    return None


def _surrogate(s: str) -> int | None:
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return ord(s[e.start])
    return None


_Model = TypeVar("_Model", bound=BaseModel)


def parse(model: type[_Model], raw: bytes) -> _Model:
    """Validate a JSON body; raises `ApiError(400)` naming the problem."""
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise ApiError(400, f"invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # bad JSON or encoding, NaN, an integer past Python's 4300 digits
        raise ApiError(400, f"invalid JSON body: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object, not {type(data).__name__}")
    problem = _text_problem(data)
    if problem is not None:
        raise ApiError(400, problem)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ApiError(400, validation_message(e)) from None


# --- requests ----------------------------------------------------------------------------------
class _Strict(BaseModel):
    # Unknown fields are ignored, as AICI's server and OpenAI's do; known ones must have their type.
    model_config = ConfigDict(strict=True, extra="ignore")


class _Sampling(_Strict):
    temperature: Annotated[float, Field(ge=0, le=100)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None          # AICI's -1 = off, as 0
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    seed: Annotated[int, Field(ge=0)] | None = None
    controller: Annotated[str, Field(min_length=1, max_length=300)] | None = None
    controller_arg: Any = ""

    def arg_bytes(self) -> bytes:
        """AICI's rule: a JSON string is passed as is, any other JSON value as its JSON text."""
        a = self.controller_arg
        if a is None:
            return b""
        return (a if isinstance(a, str) else json.dumps(a)).encode("utf-8")

    def sampling(self, max_tokens: int, default_temperature: float) -> SamplingParams:
        return SamplingParams(temperature=default_temperature if self.temperature is None else self.temperature,
                              top_p=SamplingParams.top_p if self.top_p is None else self.top_p,
                              top_k=max(0, self.top_k or 0), max_tokens=max_tokens, seed=self.seed)


class RunRequest(_Sampling):
    """`POST /v1/run` (AICI). `chat`: wrap the prompt in the model's chat template (default: the
    prompt as is, as AICI does)."""
    controller: Annotated[str, Field(min_length=1, max_length=300)]
    prompt: str = ""
    chat: bool = False


#: OpenAI (and vLLM) request fields aicirt serve does not honour: accepted only at their no-op
#: value, any other value is a 400 that names the field (never silently ignored).
_NO_OP_VALUES: dict[str, tuple] = {
    "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
    "logit_bias": ({},), "best_of": (1,), "suffix": ("",), "modalities": (["text"],), "min_tokens": (0,),
    "min_p": (0, 0.0), "include_stop_str_in_output": (False,), "skip_special_tokens": (True,),
    "ignore_eos": (False,), "stop_token_ids": ([],), "echo": (False,),
}
#: Fields that do not change the output; accepted and not acted on.
_HARMLESS = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"})
#: Fields handled by `structured.plan` from `model_extra` (vLLM's names).
STRUCTURED_EXTRAS = frozenset({"grammar", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                               "structured_outputs", "key_order"})
_HINTS = {"functions": "use tools", "function_call": "use tool_choice",
          "guided_decoding_backend": "aicirt enforces constraints with its own controllers"}


class _OpenAI(_Sampling):
    # Unknown fields are collected (`model_extra`) and refused by `check_unsupported`: a stock
    # client sends only what its caller gave, and a field the server cannot honour is a 400.
    model_config = ConfigDict(strict=True, extra="allow")
    model: str | None = None
    stream: bool = False
    stream_options: dict | None = None
    n: Annotated[int, Field(ge=1, le=16)] | None = None
    stop: None | str | Annotated[list[str], Field(max_length=16)] = None
    response_format: dict | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    tool_format: str | None = None           # aicirt's: the tool-call format, instead of the template's

    def check_unsupported(self) -> None:
        """Raise `ApiError(400)` naming a field this server does not honour (see `_NO_OP_VALUES`)."""
        for name, value in (self.model_extra or {}).items():
            if name in _HARMLESS or name in STRUCTURED_EXTRAS:
                continue
            if name in _NO_OP_VALUES:
                if value is None or any(value == ok and type(value) is type(ok) for ok in _NO_OP_VALUES[name]):
                    continue
                raise ApiError(400, f"{name}: not supported (only {_NO_OP_VALUES[name][0]!r})")
            hint = _HINTS.get(name)
            raise ApiError(400, f"{name}: not a field aicirt serve honours" + (f" ({hint})" if hint else ""))
        for key, value in (self.stream_options or {}).items():
            if key != "include_usage" and value not in (None, False):
                raise ApiError(400, f"stream_options.{key}: not supported (include_usage is)")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple; raises `ApiError(400)` for an empty string."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops) and not (isinstance(self.stop, str) and self.stop == ""):
            raise ApiError(400, "stop: a stop string must not be empty")
        return tuple(s for s in stops if s)

    @property
    def top_logprobs_wanted(self) -> int | None:
        """Alternatives per token for `logprobs` (None: off)."""
        raise NotImplementedError

    def sampling(self, max_tokens: int, default_temperature: float) -> SamplingParams:
        return SamplingParams(temperature=default_temperature if self.temperature is None else self.temperature,
                              top_p=SamplingParams.top_p if self.top_p is None else self.top_p,
                              top_k=max(0, self.top_k or 0), max_tokens=max_tokens, seed=self.seed,
                              stop=self.stop_strings, logprobs=self.top_logprobs_wanted)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_OpenAI):
    """`POST /v1/completions`. The prompt goes to the model as is (no chat template). `logprobs`:
    OpenAI's legacy integer (0-5 alternatives per token)."""
    prompt: Union[str, Annotated[list[str], Field(min_length=1, max_length=1)]]
    logprobs: Annotated[int, Field(ge=0, le=5)] | bool | None = None

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def top_logprobs_wanted(self) -> int | None:
        if self.logprobs is None or self.logprobs is False:
            return None
        return 0 if self.logprobs is True else int(self.logprobs)


class _TextPart(_Strict):
    type: Literal["text"]
    text: str


class _FunctionCall(_Strict):
    name: str
    arguments: str


class _ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: _FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[_TextPart], None] = None
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None      # an assistant turn's calls (history)
    tool_call_id: str | None = None                # a tool turn: the call it answers

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(_OpenAI):
    """`POST /v1/chat/completions`; the messages go through the model's chat template.
    `logprobs` (bool) with `top_logprobs` (0-20 alternatives per token)."""
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    @property
    def top_logprobs_wanted(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:
                raise ApiError(400, "top_logprobs: needs logprobs: true")
            return None
        return self.top_logprobs or 0


class TagRequest(_Strict):
    """`POST /v1/controllers/tags`."""
    module_id: str
    tags: Annotated[list[str], Field(min_length=1, max_length=100)]


# --- prompts and limits ------------------------------------------------------------------------
def chat_template(backend: Any) -> str | None:
    """The model's chat template text (what picks the tool-call format), None without one."""
    hf = getattr(backend, "hf_tokenizer", None)
    t = getattr(hf, "chat_template", None) if hf is not None else getattr(backend, "_template", None)
    return t if isinstance(t, str) and t else None


def chat_tokens(backend: Any, messages: list[ChatMessage], tools: list | None = None,
                family: Any = None) -> list[int]:
    """Token ids of a conversation, through the model's chat template where it has one.

    `tools` (`aicirt.program.tools.Tool`s) in `family`'s format: given to the template (which
    renders them) or, for a family whose template does not (`Family.system_prompt`), described in
    a system message before the conversation; earlier calls in the history are written in the
    family's format where the template cannot render them."""
    from aicirt.program import tools as T

    native = family is not None and not family.system_prompt
    turns = [_turn(m, None if native else family or T.GENERIC) for m in messages]
    if tools and not native:
        turns.insert(0, {"role": "system", "content": T.system_message(tools, family or T.GENERIC)})
    hf = getattr(backend, "hf_tokenizer", None)
    if hf is not None and getattr(hf, "chat_template", None):
        kw = {"tools": [t.as_openai() for t in tools]} if native and tools else {}
        ids = hf.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, **kw)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    if len(turns) == 1 and turns[0]["role"] == "user":
        return backend.format_prompt(turns[0]["content"], chat=True)
    text = "".join(f"{t['role']}: {t['content']}\n" for t in turns) + "assistant: "
    return backend.encode(text)


def _turn(m: ChatMessage, written_in: Any) -> dict:
    """One message as a chat template reads it. An assistant turn's `tool_calls` go to the
    template (arguments parsed, as templates expect a mapping) or, with `written_in` a family,
    into the text in that family's format."""
    turn: dict[str, Any] = {"role": m.role, "content": m.text}
    if m.tool_call_id is not None:
        turn["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        turn["name"] = m.name
    if m.tool_calls:
        if written_in is not None:
            turn["content"] = (m.text + "".join(
                written_in.call_begin(c.function.name) + c.function.arguments + written_in.end
                for c in m.tool_calls)).strip()
        else:
            turn["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                                  for c in m.tool_calls]
    return turn


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):   # not JSON, or nested past Python's limit: kept as text
        return text


def context_length(backend: Any, configured: int | None) -> int:
    """Tokens a sequence may hold: the setting, else the model's own limit, else 4096."""
    if configured:
        return configured
    config = getattr(backend, "config", None)
    n = getattr(config, "max_position_embeddings", None)
    if n:
        return int(n)
    llm = getattr(backend, "llm", None)
    if llm is not None and hasattr(llm, "n_ctx"):
        return int(llm.n_ctx())
    return 4096


def check_length(prompt: list[int], max_tokens: int | None, context: int, default: int) -> int:
    """The request's max_tokens; raises `ApiError(400)` for an empty prompt or one past the context."""
    if not prompt:
        raise ApiError(400, "prompt: the prompt has no tokens (give some text, or chat: true for the chat template)")
    room = context - len(prompt)
    if max_tokens is None:
        if room < 1:
            raise ApiError(400, f"prompt: {len(prompt)} tokens leave no room in the model's context of {context}")
        return min(default, room)
    if len(prompt) + max_tokens > context:
        raise ApiError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                            f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, {max_tokens} in the "
                            f"completion). Please reduce the length of the prompt or max_tokens.")
    return max_tokens


# --- AICI's stream -----------------------------------------------------------------------------
#: The engine's finish reasons under AICI's names (rllm's FinishReason::short_name).
AICI_FINISH = {"stop": "aici-stop", "eos": "eos", "length": "length", "error": "fail", "abort": "abort"}
OPENAI_FINISH = {"stop": "stop", "eos": "stop", "length": "length", "error": "error", "abort": "abort"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


def initial_run(run_id: str, created: int, model: str) -> dict:
    return {"id": run_id, "object": "initial-run", "created": created, "model": model}


def _storage(d: ForkDelta) -> list[dict]:
    return [{"WriteVar": {"name": name, "value": value.hex(), "op": "Append" if op == "append" else "Set",
                          "when_version_is": None}} for op, name, value in d.storage]


def run_object(u: Update) -> dict:
    forks = []
    for d in u.forks:
        f = {"index": d.index, "text": d.text, "error": d.error, "logs": d.logs, "storage": _storage(d),
             "micros": d.micros}
        if d.finish_reason is not None:
            f["finish_reason"] = AICI_FINISH.get(d.finish_reason, d.finish_reason)
        if d.backtrack:
            f["backtrack"] = d.backtrack
        forks.append(f)
    return {"object": "run", "forks": forks,
            "usage": {"sampled_tokens": u.usage.sampled_tokens, "ff_tokens": u.usage.ff_tokens, "cost": u.usage.cost}}


def sse(obj: object) -> bytes:
    """One server-sent event: `data: ...` and a blank line (AICI's client accepts nothing else)."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n".encode()


# --- OpenAI's shapes ---------------------------------------------------------------------------
def _ext(d: ForkDelta) -> dict:
    out: dict[str, object] = {}
    if d.backtrack:
        out["backtrack"] = d.backtrack
    if d.logs:
        out["logs"] = d.logs
    if d.error:
        out["error"] = d.error
    return out


def openai_usage(prompt_tokens: int, u: Usage) -> dict:
    completion = u.sampled_tokens + u.ff_tokens - prompt_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def completion_chunk(cid: str, created: int, model: str, u: Update, chat: bool, first: bool,
                     logprobs: dict[int, dict] | None = None) -> dict:
    """One streamed chunk; `logprobs`: per fork index, its `logprobs_object` for this delta."""
    choices = []
    for d in u.forks:
        c = {"index": d.index, "finish_reason": OPENAI_FINISH.get(d.finish_reason) if d.finish_reason else None,
             "logprobs": (logprobs or {}).get(d.index), **_ext(d)}
        if chat:
            c["delta"] = {"role": "assistant", "content": d.text} if first else {"content": d.text}
        else:
            c["text"] = d.text
        choices.append(c)
    return {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": choices}


def tool_delta_chunk(cid: str, created: int, model: str, index: int, delta: dict, finish_reason: str | None = None,
                     logprobs: dict | None = None) -> dict:
    """A streamed chunk of a tool-calling choice: `delta` is OpenAI's (`role`, `content`, or
    `tool_calls` entries: the first of a call with its index, id, type and name, then pieces of
    its arguments); the last chunk of a choice has an empty delta and its finish reason."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}


def finish_reason(engine_reason: str | None, calls: list) -> str | None:
    """OpenAI's finish reason: `tool_calls` for a choice that ended (not cut by length) with calls."""
    reason = OPENAI_FINISH.get(engine_reason, engine_reason) if engine_reason else None
    return "tool_calls" if calls and reason == "stop" else reason


def logprobs_object(backend: Any, entries: list, chat: bool, offset: int = 0) -> dict:
    """OpenAI's `logprobs` of a choice (or a delta) from (token id, (logprob, alternatives))
    entries: chat's `{"content": [{token, logprob, bytes, top_logprobs}]}` or completions'
    `{tokens, token_logprobs, top_logprobs, text_offset}` (`offset`: characters before the first)."""
    def piece(t: int) -> tuple[str, list[int]]:
        b = backend.decode_bytes([t])
        return b.decode("utf-8", "replace"), list(b)

    if chat:
        content = []
        for t, (lp, alts) in entries:
            tok, raw = piece(t)
            content.append({"token": tok, "logprob": lp, "bytes": raw,
                            "top_logprobs": [{"token": piece(a)[0], "logprob": alp, "bytes": piece(a)[1]}
                                             for a, alp in alts]})
        return {"content": content}
    tokens, lps, tops, offsets = [], [], [], []
    for t, (lp, alts) in entries:
        tok = piece(t)[0]
        tokens.append(tok)
        lps.append(lp)
        tops.append({piece(a)[0]: alp for a, alp in alts})
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def usage_chunk(cid: str, created: int, model: str, chat: bool, usage: dict) -> dict:
    return {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [], "usage": usage}


def completion_response(cid: str, created: int, model: str, forks: list[dict], chat: bool, usage: dict,
                        variables: dict[str, bytes]) -> dict:
    """`forks`: per fork `{index, text, finish_reason, logs, error}` and optionally `tool_calls`
    (OpenAI's shape: then `text` is the content, None for none) and `logprobs` (the whole run)."""
    choices = []
    for f in forks:
        calls = f.get("tool_calls") or []
        c = {"index": f["index"], "finish_reason": finish_reason(f["finish_reason"], calls),
             "logprobs": f.get("logprobs")}
        if f["logs"]:
            c["logs"] = f["logs"]
        if f["error"]:
            c["error"] = f["error"]
        if chat:
            c["message"] = {"role": "assistant", "content": f["text"]}
            if calls:
                c["message"]["tool_calls"] = calls
        else:
            c["text"] = f["text"]
        choices.append(c)
    out = {"id": cid, "object": "chat.completion" if chat else "text_completion", "created": created,
           "model": model, "choices": choices, "usage": usage}
    if variables:
        out["variables"] = {k: v.hex() for k, v in variables.items()}
    return out


def models_list(model: str, created: int | None = None) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created or int(time.time()),
                                        "owned_by": "aicirt"}]}
