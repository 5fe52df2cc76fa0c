"""The OpenAI routes' structured outputs on the real default model (SmolLM2-135M) through the stock
`openai` client: each output parsed and validated. Slow; needs `make setup-model`."""
from __future__ import annotations

import json

import jsonschema
import pytest
from _server_helpers import live_server

from aicirt.serve.settings import Settings

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                   "required": ["zone"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    pytest.importorskip("fastapi")
    pytest.importorskip("torch")
    openai = pytest.importorskip("openai")
    from aicirt.engine.backends import load_backend

    try:
        backend = load_backend("smollm2")
    except (FileNotFoundError, ImportError) as e:
        pytest.skip(f"the default model is not installed: {e}")
    with live_server(Settings(store=str(tmp_path_factory.mktemp("store"))), backend=backend) as (base, _):
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)


def create(client, **kw):
    return client.chat.completions.create(model="smollm2", temperature=kw.pop("temperature", 0),
                                          max_tokens=kw.pop("max_tokens", 60), **kw)


def valid_calls(choice, names=None, content=False):
    """The choice's calls, each naming one of `names` with arguments that validate; no content
    (text before the calls) unless `content` (tool_choice auto)."""
    calls = choice.message.tool_calls
    assert calls and choice.finish_reason == "tool_calls" and (content or choice.message.content is None)
    for c in calls:
        assert c.function.name in (names or SCHEMAS)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return calls


def test_json_object(client):
    r = create(client, messages=[{"role": "user", "content": "Give the name and country of Paris as a JSON object."}],
               response_format={"type": "json_object"}, max_tokens=200)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_json_schema_strict(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    r = create(client, messages=[{"role": "user", "content": "Give the city and population of Paris."}],
               response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
               max_tokens=80)
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tools_required_and_named(client, choice):
    r = create(client, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=80)
    names = ["get_time"] if isinstance(choice, dict) else None
    valid_calls(r.choices[0], names)


def test_tools_auto(client):
    r = create(client, messages=ASK, tools=[WEATHER, TIME], tool_choice="auto", max_tokens=80)
    c = r.choices[0]
    if c.message.tool_calls:                  # the model may answer in prose; then there is no call
        valid_calls(c, content=True)
    else:
        assert c.message.content and c.finish_reason in ("stop", "length")


def test_stop(client):
    r = create(client, messages=[{"role": "user", "content": "Tell me about Paris."}], stop=[" ", "zzz"], max_tokens=40)
    assert " " not in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    plain = create(client, messages=[{"role": "user", "content": "Tell me about Paris."}], max_tokens=40)
    assert plain.choices[0].message.content.startswith(r.choices[0].message.content + " ")


def test_structural_tag(client):
    fmt = {"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "tag", "begin": "<city>", "content": {"type": "regex", "pattern": "[A-Z][a-z]{1,20}"}, "end": "</city>"}]}
    r = create(client, messages=[{"role": "user", "content": "Which city is the capital of France?"}],
               response_format={"type": "structural_tag", "format": fmt})
    import re

    assert re.fullmatch(r"Answer: <city>[A-Z][a-z]{1,20}</city>", r.choices[0].message.content)


def test_n_2(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 30}},
              "required": ["name", "age"], "additionalProperties": False}
    r = create(client, messages=[{"role": "user", "content": "Describe a cat as JSON."}], n=2, temperature=0.8, seed=1,
               response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}, max_tokens=80)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), schema)
