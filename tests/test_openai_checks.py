"""The OpenAI routes' request checks (issue 29): max_tokens bounds every output, forced text
included; a required tool call that cannot fit is a 400 naming max_tokens; a 1,000-level schema is
a 4xx with the cause, never a 500; a $ref loop's message names it. Scripted engine (parrot model)."""
from __future__ import annotations

import json
import sys

import httpx
import pytest

pytest.importorskip("fastapi")

from test_openai_routes import url  # noqa: E402,F401  (the module's live server)

TOOLS = [{"type": "function", "function": {"name": "get_weather_in_city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def post(url, **body):
    b = {"messages": [{"role": "user", "content": "SAY:hi|"}], "temperature": 0, **body}
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))     # json.dumps of a deep body
    try:
        data = json.dumps(b)
    finally:
        sys.setrecursionlimit(old)
    return httpx.post(url + "/v1/chat/completions", content=data, headers={"content-type": "application/json"},
                      timeout=120)


def test_max_tokens_bounds_forced_text(url):
    """A const string is fast-forwarded whole by the program controller; max_tokens cuts it."""
    schema = {"type": "object", "properties": {"k": {"const": "x" * 200}}, "required": ["k"]}
    r = post(url, max_tokens=5, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["completion_tokens"] <= 5, out
    assert out["choices"][0]["finish_reason"] == "length"
    assert len(out["choices"][0]["message"]["content"]) <= 5 * 4, out   # at most 5 byte tokens


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather_in_city"}}])
def test_a_required_call_that_cannot_fit_is_a_400_naming_max_tokens(url, choice):
    r = post(url, max_tokens=3, tools=TOOLS, tool_choice=choice)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("max_tokens: 3 cannot hold the shortest tool call"), r.text


def test_a_required_call_that_fits_is_made(url):
    r = post(url, max_tokens=200, tools=TOOLS, tool_choice="required")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["tool_calls"], r.text


def _deep(n):
    d = {"type": "integer"}
    for _ in range(n):
        d = {"type": "object", "properties": {"a": d}}
    return d


@pytest.mark.parametrize("as_text", [False, True])
def test_a_thousand_level_schema_is_a_4xx_naming_the_cause(url, as_text):
    d = _deep(1000)
    if as_text:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(20000)
        try:
            d = json.dumps(d)
        finally:
            sys.setrecursionlimit(old)
    r = post(url, max_tokens=20, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": d}})
    assert 400 <= r.status_code < 500, r.text
    assert "nested" in r.json()["error"]["message"], r.text


def test_a_ref_loop_through_all_of_names_it(url):
    schema = {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}
    r = post(url, max_tokens=20, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert r.status_code == 400, r.text
    assert "$ref loop through allOf" in r.json()["error"]["message"] and "#/$defs/a/allOf/0" in r.text, r.text


def test_a_malformed_keyword_is_a_400_with_its_pointer(url):
    schema = {"type": "object", "properties": {"n": {"type": "number", "maximum": "abc"}}}
    r = post(url, max_tokens=20, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert r.status_code == 400, r.text
    assert "#/properties/n/maximum (not a number)" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("field", ["grammar", "structured_outputs"])
def test_a_grammar_with_no_finite_sentence_is_a_400_naming_the_rules(url, field):
    g = 'start: a\na: "x" a\n'
    r = post(url, max_tokens=20, **({field: g} if field == "grammar" else {field: {"grammar": g}}))
    assert r.status_code == 400, r.text
    assert "no finite sentence: rules 'start', 'a' never end" in r.json()["error"]["message"], r.text


SCHEMA_AB = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
             "required": ["a", "b"], "additionalProperties": False}


@pytest.mark.parametrize("order,ok", [(None, True), ("any", True), ("schema", False)])
def test_keys_in_another_order_are_accepted_by_default(url, order, ok):
    """The parrot wants `{"b":"x","a":1}` (keys out of schema order): by default it is written as
    is; with key_order "schema" the schema's order is enforced and the wish is cut."""
    extra = {} if order is None else {"key_order": order}
    r = post(url, max_tokens=40, messages=[{"role": "user", "content": 'SAY:{"b":"x","a":1}|'}],
             response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA_AB}}, **extra)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    assert (text == '{"b":"x","a":1}') == ok, text
    if not ok:
        assert text.startswith('{"a":'), text      # the schema's first key, whatever the model wants


def test_key_order_must_be_any_or_schema(url):
    r = post(url, max_tokens=5, key_order="sorted",
             response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA_AB}})
    assert r.status_code == 400 and "key_order" in r.json()["error"]["message"], r.text
