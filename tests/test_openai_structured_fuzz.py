"""Hypothesis over the OpenAI routes' structured-output fields (issue 29): bodies built from the
request models' own description (`protocol.ChatRequest` / `CompletionRequest` JSON Schemas and
the vLLM extras), with response formats, tools, tool_choice, grammars and key_order drawn from
near-valid values (deep, looping, malformed or oversize schemas; grammars with no finite
sentence; budgets too small for a required call) and from any JSON. Every answer is a success or
a 4xx whose JSON error names the problem, never a 5xx; well-formed requests after it still work
(tests/fuzz/server_targets.py)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from _budget import examples  # noqa: E402
from fuzz import server_targets as S  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from aicirt.serve import protocol as P  # noqa: E402

SCALARS = st.none() | st.booleans() | st.integers(-3, 10 ** 6) | st.floats(allow_nan=False) | st.text(max_size=8)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                          max_size=3), max_leaves=10)


def _deep(n):
    d: dict = {"type": "integer"}
    for _ in range(n):
        d = {"type": "object", "properties": {"a": d}}
    return d


SCHEMAS = st.sampled_from([
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]},
    {"oneOf": [{"type": "boolean"}, {"not": {"enum": [2]}}, {"enum": [True]}]},
    {"type": "number", "maximum": "abc"}, {"type": "object", "required": "a"}, {"properties": []},
    {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, {"$ref": "#/nowhere"},
    _deep(200), {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(1500)}},
    {"enum": []}, {"type": "strin"}, {"minLength": -1}, True, False,
]) | JSON
GRAMMARS = st.sampled_from(['start: "yes" | "no"', 'start: a\na: "x" a\n', 'start: start', 'start: "\\ud800"',
                            'root ::= "a" | "b"', 'start: /[0-9]+/', "start: x", ""]) | st.text(max_size=20)
TOOL = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "get_weather", "a b", ""])}, optional={"parameters": SCHEMAS})})


def structured():
    """Values for the structured fields, near-valid or any JSON."""
    fmt = st.one_of(
        st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
            {"name": st.just("x")}, optional={"schema": SCHEMAS | SCHEMAS.map(json.dumps), "strict": st.booleans()})}),
        st.fixed_dictionaries({"type": st.just("json_object")}),
        st.fixed_dictionaries({"type": st.just("grammar"), "grammar": GRAMMARS}),
        st.fixed_dictionaries({"type": st.sampled_from(["structural_tag", "text", "regex"])}, optional={"format": JSON}),
        JSON)
    return {
        "response_format": fmt,
        "tools": st.lists(TOOL, max_size=2) | JSON,
        "tool_choice": st.sampled_from(["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]) | JSON,
        "parallel_tool_calls": st.booleans() | JSON,
        "grammar": GRAMMARS | JSON, "guided_json": SCHEMAS, "guided_regex": st.sampled_from(["[0-9]{3}", "(", ""]) | JSON,
        "guided_choice": st.lists(st.text(max_size=4), max_size=3) | JSON,
        "structured_outputs": st.fixed_dictionaries({}, optional={"json": SCHEMAS, "grammar": GRAMMARS,
                                                                   "regex": st.text(max_size=6)}) | JSON,
        "key_order": st.sampled_from(["any", "schema", "sorted"]) | JSON,
        "n": st.integers(1, 3), "stop": st.sampled_from([None, ["\n"], "x"]),
    }


FIELDS = structured()


def _model_fields(model) -> list[str]:
    """The request model's own description: its JSON Schema's properties."""
    return sorted(model.model_json_schema().get("properties", {}))


ROUTES = {"/v1/chat/completions": _model_fields(P.ChatRequest), "/v1/completions": _model_fields(P.CompletionRequest)}


@st.composite
def body(draw):
    path = draw(st.sampled_from(sorted(ROUTES)))
    b: dict = {"max_tokens": draw(st.integers(1, 12)), "temperature": 0}
    b.update({"messages": [{"role": "user", "content": "hi"}]} if path.endswith("chat/completions") else {"prompt": "hi"})
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=3, unique=True)):
        b[name] = draw(FIELDS[name])
    described = [f for f in ROUTES[path] if f not in b and f not in ("stream", "stream_options")]
    for name in draw(st.lists(st.sampled_from(described), max_size=1)):
        b[name] = draw(JSON)                 # any other described field, garbled
    return path, b


@settings(max_examples=examples(120), deadline=None, suppress_health_check=list(HealthCheck))
@given(body())
def test_structured_fields_never_give_a_5xx(case):
    path, b = case
    S.request("POST", path, json.dumps(b).encode("utf-8"))
    S.check_healthy()
