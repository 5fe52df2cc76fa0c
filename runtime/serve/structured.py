"""OpenAI's structured-output fields, as the OpenAI routes turn them into one `program` run.

`plan(body, template)` reads a request's `response_format`, `tools` / `tool_choice` /
`parallel_tool_calls`, `n` and vLLM's extra fields (`grammar`, `guided_json`, `guided_regex`,
`guided_choice`, `guided_grammar`, `structured_outputs`) and gives a `Plan`: the structural-tag
format the shipped `program` controller enforces (docs/program.md), with `n > 1` as a `fork` of n
copies of it (a lone grammar runs on the `grammar` controller). `Plan.reply(text)` turns a finished choice's text back into OpenAI's message
(`tool_calls`, content null when the reply is only calls). Every malformed or conflicting field
is an `ApiError(400)` that names it; a field is never dropped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aicirt.program import tools as T

from .protocol import ApiError

#: The controller that runs a plan (its argument: `{"type": "structural_tag", "format": F}`), and
#: the one that runs a lone grammar (its argument: the grammar's text, Lark or GBNF).
PROGRAM = "program"
GRAMMAR = "grammar"
#: At most this many choices a request (docs/protocol.md#limits: forks per request).
MAX_N = 16


@dataclass
class Plan:
    """What a request asks of the output. `format`: None = unconstrained (plain generation when
    `n` is 1); `tools`/`choice`/`family`: the tool-calling part (`choice` "none" without tools)."""
    format: dict | None = None
    n: int = 1
    tools: list[T.Tool] = field(default_factory=list)
    choice: str = "none"
    family: T.Family = T.GENERIC

    @property
    def calls_tools(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def needs_program(self) -> bool:
        return self.format is not None or self.n > 1

    def program(self) -> dict:
        """The `program` controller's argument."""
        fmt = self.format if self.format is not None else {"type": "any_text"}
        if self.n > 1:
            fmt = {"type": "fork", "branches": [fmt] * self.n}
        return {"type": "structural_tag", "format": fmt}

    def controller(self) -> tuple[str, bytes]:
        """(controller, argument) that runs the plan: a lone grammar (one choice) goes to the
        `grammar` controller itself; everything else to `program`. The controller checks the
        program on its first call, on the server's runtime and its model's tokenizer: a program it
        refuses is a 400 leading with its words, "program: at POINTER: WHY" (the loop's refused
        start), before anything streams. Python keeps no copy of its rules."""
        f = self.format
        if self.n == 1 and isinstance(f, dict) and f.get("type") == "grammar" and set(f) == {"type", "grammar"}:
            return GRAMMAR, str(f["grammar"]).encode("utf-8")
        return PROGRAM, json.dumps(self.program()).encode("utf-8")

    def reply(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool_calls in OpenAI's shape) of one finished choice."""
        if not self.calls_tools:
            return text, []
        content, calls = T.parse(text, self.family)
        return content, [c.as_openai() for c in calls]


def plan(body: Any, template: str | None) -> Plan:
    """The plan of an OpenAI request (`protocol.ChatRequest` or `CompletionRequest`); `template`:
    the model's chat template, which picks the tool-call format unless `tool_format` names one.
    Raises `ApiError(400)` naming the field."""
    p = Plan(n=body.n or 1)
    try:
        p.family = T.family(body.tool_format) if body.tool_format else T.detect_family(template)
        if body.tools is not None or body.tool_choice is not None:
            _tools(body, template, p)
    except T.ToolError as e:
        raise ApiError(400, str(e)) from None
    fmt = _output_format(body)
    if p.calls_tools:
        # a reply cut by its max_tokens still ends with valid calls: the arguments are completed
        # once they have taken most of it (docs/tools.md)
        budget = getattr(body, "max_completion_tokens", None) or body.max_tokens
        calls = T.render(p.tools, p.choice, parallel=body.parallel_tool_calls is not False, fam=p.family,
                         complete_by=budget)
        if p.choice == "auto" and fmt is not None:
            # Either an answer in the response format or tool calls (OpenAI's auto with both).
            required = T.render(p.tools, "required", parallel=body.parallel_tool_calls is not False, fam=p.family,
                                complete_by=budget)
            fmt = {"type": "or", "elements": [fmt, required]}
        else:     # with required or a named function the reply is calls only: no content to format
            fmt = calls
    p.format = fmt
    if p.needs_program and body.controller:
        raise ApiError(400, "controller: cannot be combined with response_format, tools, grammar or n > 1 "
                            "(those run the `program` controller)")
    return p


def check_call_budget(p: Plan, max_tokens: int | None, encode: Any) -> None:
    """A reply that must be a tool call (`tool_choice` "required" or a named function) and whose
    `max_tokens` cannot hold the shortest one is refused up front: `ApiError(400)` naming
    `max_tokens`, instead of a reply cut with no call. The shortest call is counted as the
    tokenizer writes its forced text around empty arguments (`{}`), less two tokens for merges at
    the arguments' edges: a lower bound, so no call that fits is refused."""
    if not p.calls_tools or p.choice == "auto" or max_tokens is None:
        return
    tools = p.tools if p.choice == "required" else [t for t in p.tools if p.choice == "function:" + t.name]
    texts = [p.family.call_begin(t.name) + "{}" + p.family.end for t in tools]
    if not texts:
        return
    need, text = min((max(1, len(encode(t)) - 2), t) for t in texts)
    if max_tokens < need:
        raise ApiError(400, f"max_tokens: {max_tokens} cannot hold the shortest tool call that tool_choice "
                            f"{'requires' if p.choice == 'required' else 'names'} (at least {need} tokens: {text!r})")


def _tools(body: Any, template: str | None, p: Plan) -> None:
    if not hasattr(body, "messages"):
        raise ApiError(400, "tools: tool calling is a chat feature (use /v1/chat/completions)")
    if body.tools is None:
        if body.tool_choice not in (None, "none"):
            raise ApiError(400, "tool_choice: given without tools")
        return
    p.tools = T.tools_from_openai(body.tools)
    p.choice = T.choice_from_openai(body.tool_choice, p.tools)


def _output_format(body: Any) -> dict | None:
    """The one constraint on the text the request gives, as a format; 400 when two are given."""
    sources = []
    if body.response_format is not None:
        f = _response_format(body.response_format)
        if f is not None:
            sources.append(("response_format", f))
    extra = body.model_extra or {}
    for name, conv in _VLLM_FIELDS.items():
        value = extra.get(name)
        if value is not None:
            sources.append((name, conv(value)))
    so = extra.get("structured_outputs")
    if so is not None:
        sources.extend(_structured_outputs(so))
    if len(sources) > 1:
        raise ApiError(400, f"{sources[1][0]}: only one output constraint a request "
                            f"({' and '.join(n for n, _ in sources)} given)")
    order = extra.get("key_order", "any")
    if order not in ("any", "schema"):
        raise ApiError(400, f"key_order: {json.dumps(order)[:40]} is not \"any\" or \"schema\"")
    fmt = sources[0][1] if sources else None
    if fmt is not None and fmt.get("type") == "json_schema" and order == "any":
        # a valid document's keys in any order, as OpenAI's and llguidance's users expect; the
        # request field key_order: "schema" keeps the schema's order (docs/tools.md)
        fmt = {**fmt, "x-any-order": True}
    return fmt


def _schema(where: str, value: Any) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ApiError(400, f"{where}: not JSON: {e}") from None
        except RecursionError:
            raise ApiError(400, f"{where}: not JSON: nested too deeply for this server") from None
    if isinstance(value, bool):
        value = {} if value else None
    if not isinstance(value, dict):
        raise ApiError(400, f"{where}: a JSON Schema must be an object")
    return value


def _string(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"{where}: must be a non-empty string")
    return value


def _choice(where: str, value: Any) -> dict:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ApiError(400, f"{where}: must be a non-empty list of non-empty strings")
    return {"type": "or", "elements": [{"type": "const_string", "value": v} for v in value]}


def _json_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": schema}


_VLLM_FIELDS = {
    "grammar": lambda v: {"type": "grammar", "grammar": _string("grammar", v)},
    "guided_grammar": lambda v: {"type": "grammar", "grammar": _string("guided_grammar", v)},
    "guided_json": lambda v: _json_format(_schema("guided_json", v)),
    "guided_regex": lambda v: {"type": "regex", "pattern": _string("guided_regex", v)},
    "guided_choice": lambda v: _choice("guided_choice", v),
}


def _structured_outputs(so: Any) -> list[tuple[str, dict]]:
    """vLLM's `structured_outputs` (`{"json" | "regex" | "choice" | "grammar" | "json_object" |
    "structural_tag": ...}`)."""
    if not isinstance(so, dict):
        raise ApiError(400, "structured_outputs: must be an object")
    out = []
    for key, value in so.items():
        where = f"structured_outputs.{key}"
        if value is None or value is False:
            continue
        if key == "json":
            out.append((where, _json_format(_schema(where, value))))
        elif key == "json_object":
            out.append((where, _json_format({"type": "object"})))
        elif key == "regex":
            out.append((where, {"type": "regex", "pattern": _string(where, value)}))
        elif key == "grammar":
            out.append((where, {"type": "grammar", "grammar": _string(where, value)}))
        elif key == "choice":
            out.append((where, _choice(where, value)))
        elif key == "structural_tag":
            tag = _schema(where, value)
            out.append((where, _response_format({"type": "structural_tag", **tag}) or {}))
        else:
            raise ApiError(400, f"{where}: not supported (json, json_object, regex, choice, grammar, "
                                "structural_tag are)")
    return out


def _response_format(rf: Any) -> dict | None:
    """OpenAI's `response_format` as a format (None for `text`)."""
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ApiError(400, "response_format: must be an object with a `type`")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return _json_format({"type": "object"})
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise ApiError(400, "response_format.json_schema: must be an object "
                                "{\"name\": ..., \"schema\": {...}, \"strict\": ...}")
        if "strict" in js and not isinstance(js["strict"], bool):
            raise ApiError(400, "response_format.json_schema.strict: must be true or false")
        # strict or not, the schema is enforced: constrained decoding has no "best effort".
        return _json_format(_schema("response_format.json_schema.schema", js.get("schema", {"type": "object"})))
    if kind == "structural_tag":
        if "format" in rf:
            if not isinstance(rf["format"], dict):
                raise ApiError(400, "response_format.format: must be a format object")
            return dict(rf["format"])
        return _legacy_structural_tag(rf)
    if kind == "grammar":
        return {"type": "grammar", "grammar": _string("response_format.grammar", rf.get("grammar"))}
    raise ApiError(400, f"response_format.type: {kind!r} is not text, json_object, json_schema, "
                        "structural_tag or grammar")


def _legacy_structural_tag(rf: dict) -> dict:
    """vLLM's first structural-tag shape: `{"structures": [{"begin", "schema", "end"}], "triggers"}`."""
    structures, triggers = rf.get("structures"), rf.get("triggers")
    if not isinstance(structures, list) or not structures or not isinstance(triggers, list) or not triggers:
        raise ApiError(400, "response_format: a structural_tag needs `format` (or vLLM's `structures` and "
                            "`triggers`)")
    tags = []
    for i, s in enumerate(structures):
        where = f"response_format.structures[{i}]"
        if not isinstance(s, dict):
            raise ApiError(400, f"{where}: must be an object {{\"begin\", \"schema\", \"end\"}}")
        end = s.get("end")
        if not isinstance(end, str):
            raise ApiError(400, f"{where}.end: must be a string")
        tags.append({"type": "tag", "begin": _string(where + ".begin", s.get("begin")),
                     "content": _json_format(_schema(where + ".schema", s.get("schema", {}))), "end": end})
    return {"type": "triggered_tags", "triggers": [_string("response_format.triggers", t) for t in triggers],
            "tags": tags}
