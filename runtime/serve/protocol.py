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
                              top_p=1.0 if self.top_p is None else self.top_p,
                              top_k=max(0, self.top_k or 0), max_tokens=max_tokens, seed=self.seed)


class RunRequest(_Sampling):
    """`POST /v1/run` (AICI). `chat`: wrap the prompt in the model's chat template (default: the
    prompt as is, as AICI does)."""
    controller: Annotated[str, Field(min_length=1, max_length=300)]
    prompt: str = ""
    chat: bool = False


class _OpenAI(_Sampling):
    model: str | None = None
    stream: bool = False
    stream_options: dict | None = None
    n: Literal[1] | None = None
    stop: None | str | list[str] = None
    logprobs: Any = None
    user: str | None = None

    def check_unsupported(self) -> None:
        if self.stop:
            raise ApiError(400, "stop: stop sequences are not supported; a controller can stop on any pattern")
        if self.logprobs not in (None, False, 0):
            raise ApiError(400, "logprobs: not supported")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_OpenAI):
    """`POST /v1/completions`. The prompt goes to the model as is (no chat template)."""
    prompt: Union[str, Annotated[list[str], Field(min_length=1, max_length=1)]]
    echo: Literal[False] | None = None

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class _TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[_TextPart], None] = None
    name: str | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(_OpenAI):
    """`POST /v1/chat/completions`; the messages go through the model's chat template."""
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None


class TagRequest(_Strict):
    """`POST /v1/controllers/tags`."""
    module_id: str
    tags: Annotated[list[str], Field(min_length=1, max_length=100)]


# --- prompts and limits ------------------------------------------------------------------------
def chat_tokens(backend: Any, messages: list[ChatMessage]) -> list[int]:
    """Token ids of a conversation, through the model's chat template where it has one."""
    hf = getattr(backend, "hf_tokenizer", None)
    if hf is not None and getattr(hf, "chat_template", None):
        ids = hf.apply_chat_template([{"role": m.role, "content": m.text} for m in messages],
                                     add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    if len(messages) == 1 and messages[0].role == "user":
        return backend.format_prompt(messages[0].text, chat=True)
    text = "".join(f"{m.role}: {m.text}\n" for m in messages) + "assistant: "
    return backend.encode(text)


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


def completion_chunk(cid: str, created: int, model: str, u: Update, chat: bool, first: bool) -> dict:
    choices = []
    for d in u.forks:
        c = {"index": d.index, "finish_reason": OPENAI_FINISH.get(d.finish_reason) if d.finish_reason else None,
             "logprobs": None, **_ext(d)}
        if chat:
            c["delta"] = {"role": "assistant", "content": d.text} if first else {"content": d.text}
        else:
            c["text"] = d.text
        choices.append(c)
    return {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": choices}


def usage_chunk(cid: str, created: int, model: str, chat: bool, usage: dict) -> dict:
    return {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [], "usage": usage}


def completion_response(cid: str, created: int, model: str, forks: list[dict], chat: bool, usage: dict,
                        variables: dict[str, bytes]) -> dict:
    """`forks`: per fork `{index, text, finish_reason, logs, error}` (the whole run)."""
    choices = []
    for f in forks:
        c = {"index": f["index"], "finish_reason": OPENAI_FINISH.get(f["finish_reason"], f["finish_reason"]),
             "logprobs": None}
        if f["logs"]:
            c["logs"] = f["logs"]
        if f["error"]:
            c["error"] = f["error"]
        if chat:
            c["message"] = {"role": "assistant", "content": f["text"]}
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
