"""Tool calling: OpenAI's `tools` + `tool_choice` rendered into a program, and a reply parsed back.

`render(tools, tool_choice, parallel, family)` gives the structural-tag *format* (XGrammar's
vocabulary, docs/program.md) that the `program` controller enforces: each call is a `tag` whose
`begin` is the family's prefix with the tool's name written in, whose content is a `json_schema`
of the tool's `parameters`, and whose `end` closes the call. `parse(text, family)` turns what the
model wrote into OpenAI's `tool_calls` and the free text around them. docs/tools.md has examples.

Families (the model's native format; `detect_family(chat_template)` picks one):

| family | one call | trigger |
| --- | --- | --- |
| `hermes` (Hermes 2/3, Qwen 2.5/3) | `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>` | `<tool_call>` |
| `llama3` (Llama 3.1-3.3, JSON tool calls) | `{"name": "f", "parameters": {...}}`, parallel calls joined by `; ` | `{"name": ` |
| `generic` (any other model: the tools are described in a system message) | `<tool_call>{"name": "f", "arguments": {...}}</tool_call>` | `<tool_call>` |

`tool_choice` as OpenAI defines it: `"none"` (no tool; no constraint from the tools), `"auto"`
(free text, any number of calls: `triggered_tags`), `"required"` (one or more calls and nothing
else, joined by the family's `separator`: `tags_with_separator` with `at_least_one`),
`{"type": "function", "function": {"name": f}}` (exactly one call of f: a single `tag`).
`parallel=False` ends the reply after the first call (`stop_after_first`). Everything here raises `ToolError` (a `ValueError`) for bad input, with the
field it concerns first; nothing touches a model.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

#: OpenAI's rule for a function's name; it also keeps the name safe to write inside a JSON string.
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ToolError(ValueError):
    """A malformed `tools` / `tool_choice`; the message starts with the field it concerns."""


@dataclass(frozen=True)
class Family:
    """A tool-call format: one call is `begin + name + args_key + ARGUMENTS + end`.

    `begin` and `args_key` hold the JSON object's opening up to the arguments value, so a whole
    call (between `trigger`'s first character and `end`) is one JSON object, optionally wrapped in
    a tag. `separator`: what joins parallel calls under "required" (under "auto" any text may
    come between calls). `system_prompt`: whether the tools must be
    described in a system message (the chat template does not render `tools` itself)."""
    name: str
    begin: str
    args_key: str
    end: str
    trigger: str
    separator: str
    system_prompt: bool

    def call_begin(self, tool: str) -> str:
        """The forced text before a call's arguments: `<tool_call>\\n{"name": "f", "arguments": `."""
        return f'{self.begin}{tool}", "{self.args_key}": '


HERMES = Family("hermes", '<tool_call>\n{"name": "', "arguments", "}\n</tool_call>", "<tool_call>", "\n", False)
LLAMA3 = Family("llama3", '{"name": "', "parameters", "}", '{"name": ', "; ", False)
GENERIC = Family("generic", '<tool_call>{"name": "', "arguments", "}</tool_call>", "<tool_call>", "\n", True)
FAMILIES = {f.name: f for f in (HERMES, LLAMA3, GENERIC)}


def family(name: str) -> Family:
    """The family called `name`; raises `ToolError` naming the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ToolError(f"tool_format: unknown tool-call format {name!r} (known: {', '.join(FAMILIES)})") from None


#: A Jinja statement or expression that reads the `tools` variable.
_USES_TOOLS = re.compile(r"\{[{%][^}]*\btools\b")


def detect_family(chat_template: str | None) -> Family:
    """The format a chat template was trained on: Hermes/Qwen's `<tool_call>` tags, Llama 3's JSON
    calls (its template mentions `<|python_tag|>` or the `ipython` role with `"parameters"`), else
    `generic`. A template that does not render `tools` itself gets the generic format, whose tools
    this module describes in a system message (`system_message`)."""
    t = chat_template or ""
    renders_tools = _USES_TOOLS.search(t) is not None
    if "<tool_call>" in t and renders_tools:
        return HERMES
    if ("<|python_tag|>" in t or ("ipython" in t and "parameters" in t)) and renders_tools:
        return LLAMA3
    return GENERIC


# --- tools and tool_choice ---------------------------------------------------------------------
@dataclass(frozen=True)
class Tool:
    """One function tool: `name`, `parameters` (a JSON Schema object; `{"type": "object"}` when the
    tool gives none, as OpenAI's "no parameters"), `description`."""
    name: str
    parameters: dict
    description: str = ""

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def tools_from_openai(tools: Any) -> list[Tool]:
    """Validate OpenAI's `tools` list (`[{"type": "function", "function": {"name", "description"?,
    "parameters"?, "strict"?}}]`). Raises `ToolError` naming the bad entry (`tools[1].function.name:
    ...`), a duplicate name, or an empty list."""
    if not isinstance(tools, list) or not tools:
        raise ToolError("tools: must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    out: list[Tool] = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise ToolError(f"{where}: must be {{\"type\": \"function\", \"function\": {{...}}}} "
                            "(only function tools are supported)")
        fn = t["function"]
        unknown = set(fn) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise ToolError(f"{where}.function: unknown field(s) {', '.join(sorted(unknown))}")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ToolError(f"{where}.function.name: {name!r} is not 1-64 of a-z, A-Z, 0-9, _ and -")
        if any(o.name == name for o in out):
            raise ToolError(f"{where}.function.name: {name!r} is defined twice")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise ToolError(f"{where}.function.parameters: must be a JSON Schema object")
        if params.get("type", "object") != "object":
            raise ToolError(f"{where}.function.parameters: the arguments must be an object (\"type\": \"object\")")
        desc = fn.get("description", "")
        if not isinstance(desc, str):
            raise ToolError(f"{where}.function.description: must be a string")
        if "strict" in fn and not isinstance(fn["strict"], bool):
            raise ToolError(f"{where}.function.strict: must be true or false")
        out.append(Tool(name, params or {"type": "object"}, desc))
    return out


def choice_from_openai(tool_choice: Any, tools: list[Tool]) -> str:
    """`tool_choice` as one of "none", "auto", "required" or the forced function's name
    (returned as `"function:" + name`). None means "auto". Raises `ToolError` for another value or
    a function that is not among `tools`."""
    if tool_choice is None or tool_choice == "auto":
        return "auto"
    if tool_choice in ("none", "required"):
        return str(tool_choice)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise ToolError("tool_choice.function.name: missing (a named choice is "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}})")
        if not any(t.name == name for t in tools):
            raise ToolError(f"tool_choice.function.name: {name!r} is not one of the tools "
                            f"({', '.join(t.name for t in tools)})")
        return "function:" + name
    raise ToolError(f"tool_choice: {json.dumps(tool_choice)[:80]} is not \"none\", \"auto\", \"required\" or "
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}")


# --- rendering -------------------------------------------------------------------------------------
def call_tag(fam: Family, tool: Tool, complete_by: int | None = None) -> dict:
    """One call of `tool` as a structural-tag `tag`: the forced opening with its name, its
    arguments constrained by its `parameters`, the closing. `complete_by`: the reply's token
    budget (its max_tokens): the arguments are completed (their shortest valid completion forced)
    while the closing still fits. A `oneOf` the json matcher cannot make exact is enforced as
    `anyOf` (`x-coerce-one-of`) rather than refused; a schema that admits no document is refused
    by the controller's first call (`the schema admits no document`), before any generation."""
    content: dict[str, Any] = {"type": "json_schema", "json_schema": tool.parameters, "x-coerce-one-of": True}
    if complete_by is not None:
        content["complete_by"] = complete_by
    return {"type": "tag", "begin": fam.call_begin(tool.name), "content": content, "end": fam.end}


def render(tools: list[Tool], choice: str, *, parallel: bool = True, fam: Family = HERMES,
           complete_by: int | None = None) -> dict | None:
    """The format that enforces `choice` (from `choice_from_openai`) over `tools` in `fam`'s
    syntax; None for "none" (the tools add no constraint). With `parallel` False the reply ends
    after its first call. `complete_by`: the reply's max_tokens; a call's arguments are then
    completed in time for its closing, so a reply bound by its budget still ends with a valid
    call (a later parallel call may still be cut)."""
    if choice == "none":
        return None
    if choice.startswith("function:"):
        name = choice[len("function:"):]
        return call_tag(fam, next(t for t in tools if t.name == name), complete_by)
    tags = [call_tag(fam, t, complete_by) for t in tools]
    if choice == "required":      # calls only: no text before, between (but the separator) or after them
        return {"type": "tags_with_separator", "tags": tags, "separator": fam.separator, "at_least_one": True,
                "stop_after_first": not parallel}
    if choice != "auto":
        raise ToolError(f"tool_choice: {choice!r} is not none, auto, required or function:NAME")
    return {"type": "triggered_tags", "triggers": [fam.trigger], "tags": tags, "at_least_one": False,
            "stop_after_first": not parallel}


def system_message(tools: list[Tool], fam: Family) -> str:
    """The instructions a model without a native format reads (prepended as a system message)."""
    listing = "\n".join(json.dumps(t.as_openai()["function"], ensure_ascii=False) for t in tools)
    example = fam.call_begin("NAME") + "{...}" + fam.end
    return ("You can call these functions (JSON Schema of each one's arguments):\n" + listing +
            f"\nTo call one, write {example} with NAME one of the names above and its arguments as JSON.")


# --- parsing ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    """One parsed call: `arguments` is the JSON text of the arguments object (OpenAI's shape)."""
    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


_DECODER = json.JSONDecoder()


def parse(text: str, fam: Family) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) from a reply in `fam`'s format. Each call starts at `fam.trigger`, is one
    JSON object with `name` (a string) and `fam.args_key` (an object), and may be followed by the
    rest of `fam.end` (e.g. `</tool_call>`); what does not parse so stays in the content. Content
    is the text outside the calls, stripped, None when nothing is left (OpenAI's null). Never
    raises."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    closing = fam.end[1:].strip()          # the end after the object's "}"
    while True:
        at = text.find(fam.trigger, pos)
        if at < 0:
            break
        after = at + len(fam.trigger)
        # The call's JSON object: the trigger opens it (llama3) or follows it after white space.
        obj_at = at if fam.trigger.startswith("{") else text.find("{", after)
        obj: Any = None
        if obj_at >= 0 and (obj_at == at or not text[after:obj_at].strip()):
            try:
                obj, end = _DECODER.raw_decode(text, obj_at)
            except ValueError:
                obj = None
        args = obj.get(fam.args_key) if isinstance(obj, dict) else None
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(args, dict)):
            kept.append(text[pos:after])          # not a call: the trigger stays in the text
            pos = after
            continue
        kept.append(text[pos:at])
        rest = text[end:]
        stripped = rest.lstrip()
        if closing and stripped.startswith(closing):
            end += len(rest) - len(stripped) + len(closing)
        calls.append(ToolCall(new_call_id(), obj["name"], json.dumps(args, ensure_ascii=False)))
        pos = end
        if fam.separator.strip() and text[pos:].lstrip().startswith(fam.separator.strip()):
            pos = text.index(fam.separator.strip(), pos) + len(fam.separator.strip())
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return (content or None), calls


# --- the builder's entry point -------------------------------------------------------------------
def tool_calls(tools: Any, tool_choice: Any = "auto", *, parallel: bool = True,
               family: str | Family = "hermes") -> dict:
    """The format of OpenAI's `tools` (their JSON list) under `tool_choice`, in `family`'s syntax
    (a `Family` or its name; `detect_family(template)` picks one from a chat template). A format
    dict the builder takes (`aicirt.program.as_format`); `{"type": "any_text"}` for "none".
    Raises `ToolError` for a bad `tools`, `tool_choice` or family."""
    fam = family if isinstance(family, Family) else globals()["family"](family)
    ts = tools_from_openai(tools)
    fmt = render(ts, choice_from_openai(tool_choice, ts), parallel=parallel, fam=fam)
    return fmt if fmt is not None else {"type": "any_text"}
