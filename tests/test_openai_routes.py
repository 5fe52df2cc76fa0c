"""The OpenAI routes' structured-output fields on the scripted engine: `response_format`, `tools` +
`tool_choice`, `stop`, `n`, `logprobs`, vLLM's guided fields, and a 400 naming each field that
cannot be honoured. The model is a parrot: it wants to write what the prompt says after `SAY:`
(up to `|`), so a constraint's effect is visible (it forces the format, or lets the text through)."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from _server_helpers import live_server

from aicirt.engine.backends import ScriptedBackend
from aicirt.serve.settings import Settings

import fastapi  # noqa: E402,F401  (the dev extra: a missing one fails, never skips)

EOS = 256


def parrot_logits(tokens):
    """Logits that prefer, after the prompt, the bytes between `SAY:` and `|` and then EOS; seeded
    noise elsewhere (ScriptedBackend's), so a constraint that rules the wish out still has a choice."""
    import numpy as np

    data = bytes(t for t in tokens if t < 256)
    rng = np.random.default_rng(len(tokens))
    logits = rng.normal(0, 1, 257).astype(np.float32)
    # Without a wish it writes short things: closing quotes and brackets, digits, EOS.
    logits[list(b'"}]')] += 6
    logits[list(b"0123456789")] += 3
    logits[EOS] += 8
    start = data.find(b"SAY:")
    end = data.find(b"|", start)
    if start < 0 or end < 0:
        return logits
    target = data[start + 4:end]
    after = data.rfind(b"assistant: ")
    done = data[after + len(b"assistant: "):] if after > end else data[end + 1:]
    if target.startswith(done):
        logits[target[len(done)] if len(done) < len(target) else EOS] += 30
    return logits


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    settings = Settings(store=str(tmp_path_factory.mktemp("store")), max_context=2048, max_batch=16, max_queue=16)
    with live_server(settings, backend=ScriptedBackend(logits_fn=parrot_logits)) as (base, _):
        yield base


def chat(url, say, status=200, **body):
    msgs = body.pop("messages", None) or [{"role": "user", "content": f"SAY:{say}|"}]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": msgs, "temperature": 0, "max_tokens": 300,
                                                       **body}, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def complete(url, say, status=200, **body):
    r = httpx.post(url + "/v1/completions", json={"prompt": f"SAY:{say}|", "temperature": 0, "max_tokens": 80,
                                                  **body}, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def stream_chunks(url, path, body):
    with httpx.stream("POST", url + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln[6:]) for ln in lines[:-1]]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                                          "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                       "required": ["zone"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


def check_calls(message, names):
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == names
    for c in calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    return calls


def call_text(name, args, fam="hermes"):
    a = json.dumps(args, separators=(",", ":"))
    return {"hermes": f'<tool_call>\n{{"name": "{name}", "arguments": {a}}}\n</tool_call>',
            "llama3": f'{{"name": "{name}", "parameters": {a}}}'}[fam]


# --- response_format --------------------------------------------------------------------------------
def test_json_object_turns_prose_into_an_object(url):
    r = chat(url, "Paris is lovely.", response_format={"type": "json_object"})
    assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)
    assert r["choices"][0]["finish_reason"] == "stop"
    # what the model wanted anyway passes through unchanged
    r = chat(url, '{"a":[1,2]}', response_format={"type": "json_object"})   # compact: the matcher's separators
    assert json.loads(r["choices"][0]["message"]["content"]) == {"a": [1, 2]}


def test_json_schema_strict_output_validates(url):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    for say in ("Bob is 7.", '{"name":"Bob","age":7}'):
        r = chat(url, say, response_format={"type": "json_schema",
                                            "json_schema": {"name": "person", "schema": schema, "strict": True}})
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
    assert json.loads(r["choices"][0]["message"]["content"]) == {"name": "Bob", "age": 7}


def test_structural_tag_format_and_vllm_legacy_shape(url):
    fmt = {"type": "sequence", "elements": [{"type": "const_string", "value": "Answer: "},
                                            {"type": "regex", "pattern": "[0-9]{3}"}]}
    r = chat(url, "no idea", response_format={"type": "structural_tag", "format": fmt})
    text = r["choices"][0]["message"]["content"]
    assert text.startswith("Answer: ") and len(text) == 11 and text[8:].isdigit()
    legacy = {"type": "structural_tag", "triggers": ["<f="],
              "structures": [{"begin": "<f=x>", "schema": {"type": "object", "properties": {"k": {"type": "integer"}},
                                                           "required": ["k"]}, "end": "</f>"}]}
    r = chat(url, 'ok <f=x>{"k":5}</f>', response_format=legacy)
    assert r["choices"][0]["message"]["content"] == 'ok <f=x>{"k":5}</f>'


def test_vllm_guided_fields(url):
    r = complete(url, "maybe", guided_choice=["yes", "no"])
    assert r["choices"][0]["text"] in ("yes", "no")
    r = complete(url, "call 555-1234 now", guided_regex="[0-9]{3}-[0-9]{4}")
    assert r["choices"][0]["text"] == "555-1234" or len(r["choices"][0]["text"]) == 8
    # key_order "schema": the required key first (in any order, the noise model may open with
    # another key, which this open object allows: tests/test_openai_checks.py covers the default)
    r = complete(url, "x", structured_outputs={"json": {"type": "object", "properties": {"v": {"const": 1}},
                                                         "required": ["v"]}}, key_order="schema")
    assert json.loads(r["choices"][0]["text"]) == {"v": 1}


def test_grammar_as_response_format_and_as_vllm_extra(url):
    lark = 'start: greeting " " name\ngreeting: "hi" | "hello"\nname: /[a-z]{2,8}/'
    r = chat(url, "hello bob", response_format={"type": "grammar", "grammar": lark})
    assert r["choices"][0]["message"]["content"] == "hello bob"
    r = complete(url, "HELLO there", grammar=lark)
    text = r["choices"][0]["text"]
    assert text.split(" ")[0] in ("hi", "hello") and text.split(" ")[1].isalpha(), text
    # GBNF with n=2 runs through the program (forks), which refuses the grammar format with a
    # 400 naming it until it links the grammar controller; then each choice is "yes" or "no".
    r = httpx.post(url + "/v1/completions", timeout=120, json={"prompt": "SAY:yes|", "grammar": 'root ::= "yes" | "no"',
                                                                "n": 2, "max_tokens": 5})
    if r.status_code == 400:
        assert "grammar format needs the grammar controller" in r.json()["message"]
    else:
        assert [c["text"] in ("yes", "no") for c in r.json()["choices"]] == [True, True], r.text


# --- tools ------------------------------------------------------------------------------------------
def test_tools_auto_parses_the_models_call(url):
    say = "Let me check. " + call_text("get_weather", {"city": "Paris"})
    r = chat(url, say, tools=[WEATHER, TIME], tool_format="hermes")
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] == "Let me check."
    (call,) = check_calls(c["message"], ["get_weather"])
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_tools_auto_lets_prose_through(url):
    r = chat(url, "It is sunny.", tools=[WEATHER], tool_choice="auto", tool_format="hermes")
    c = r["choices"][0]
    assert c["message"] == {"role": "assistant", "content": "It is sunny."} and c["finish_reason"] == "stop"


@pytest.mark.parametrize("fam", ["hermes", "llama3", "generic"])
def test_tools_required_forces_a_valid_call(url, fam):
    r = chat(url, "I would rather chat.", tools=[WEATHER, TIME], tool_choice="required", tool_format=fam,
             parallel_tool_calls=False)
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
    assert len(check_calls(c["message"], [c["message"]["tool_calls"][0]["function"]["name"]])) == 1


def test_a_call_cut_by_max_tokens_still_ends_valid(url):
    note = {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}, "required": ["text", "n"],
        "additionalProperties": False}}}
    say = call_text("note", {"text": "x" * 300, "n": 1})
    r = chat(url, say, tools=[note], tool_choice="required", tool_format="hermes", max_tokens=200)
    # the reply's budget ran out inside the string: the arguments' shortest completion was forced
    # while the call's closing still fit, so the reply is a whole, valid call
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert args["text"].startswith("xxx") and len(args["text"]) < 200 and args["n"] == 0
    assert r["usage"]["completion_tokens"] <= 200


def test_tools_named_function_is_called(url):
    r = chat(url, call_text("get_weather", {"city": "Oslo"}, "llama3"), tools=[WEATHER, TIME], tool_format="llama3",
             tool_choice={"type": "function", "function": {"name": "get_time"}})
    check_calls(r["choices"][0]["message"], ["get_time"])


def test_parallel_calls_and_parallel_tool_calls_false(url):
    two = call_text("get_weather", {"city": "Rome"}) + "\n" + call_text("get_time", {"zone": "CET"})
    r = chat(url, two, tools=[WEATHER, TIME], tool_format="hermes")
    check_calls(r["choices"][0]["message"], ["get_weather", "get_time"])
    r = chat(url, two, tools=[WEATHER, TIME], tool_format="hermes", parallel_tool_calls=False)
    check_calls(r["choices"][0]["message"], ["get_weather"])
    # required: calls joined by the separator and nothing after them, though the model goes on
    r = chat(url, two + " Done.", tools=[WEATHER, TIME], tool_format="hermes", tool_choice="required")
    assert r["choices"][0]["message"]["content"] is None
    check_calls(r["choices"][0]["message"], ["get_weather", "get_time"])


def test_tool_history_is_accepted(url):
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "SAY:It is sunny.|"}]
    r = chat(url, None, messages=msgs, tools=[WEATHER])
    assert r["choices"][0]["message"]["content"] == "It is sunny."


def test_streamed_tool_calls_arrive_as_openais_incremental_deltas(url):
    say = "Let me check. " + call_text("get_weather", {"city": "Nice"}) + "\n" + call_text("get_time", {"zone": "CET"})
    body = {"messages": [{"role": "user", "content": "SAY:" + say + "|"}], "tools": [WEATHER, TIME],
            "tool_format": "hermes", "stream": True, "temperature": 0, "max_tokens": 200}
    chunks = [ch for ch in stream_chunks(url, "/v1/chat/completions", body) if ch["choices"]]
    deltas = [ch["choices"][0]["delta"] for ch in chunks]
    assert deltas[0] == {"role": "assistant", "content": None}
    content = "".join(d.get("content") or "" for d in deltas)
    entries = [e for d in deltas for e in d.get("tool_calls", [])]
    assert all(len(d.get("tool_calls", [])) <= 1 for d in deltas)
    # per call: first its header (index, id, type, name, no arguments yet), then argument pieces
    heads = [e for e in entries if "id" in e]
    assert [(h["index"], h["type"], h["function"]) for h in heads] == \
        [(0, "function", {"name": "get_weather", "arguments": ""}), (1, "function", {"name": "get_time", "arguments": ""})]
    assert all(h["id"].startswith("call_") for h in heads) and heads[0]["id"] != heads[1]["id"]
    for i, name in enumerate(["get_weather", "get_time"]):
        mine = [e for e in entries if e["index"] == i]
        assert "id" in mine[0] and all(set(e) == {"index", "function"} for e in mine[1:])
        pieces = [e["function"]["arguments"] for e in mine[1:]]
        assert len(pieces) >= 2                               # streamed as written, not in one piece
        jsonschema.validate(json.loads("".join(pieces)), SCHEMAS[name])
    assert entries.index(heads[1]) > max(k for k, e in enumerate(entries) if e["index"] == 0)
    assert content == "Let me check."
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and deltas[-1] == {}
    assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1])


def test_openai_client_accumulates_the_streamed_calls(url):
    import openai   # the dev extra
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    say = call_text("get_weather", {"city": "Oslo"})
    with client.chat.completions.stream(
            model="scripted", messages=[{"role": "user", "content": f"SAY:{say}|"}], tools=[WEATHER, TIME],
            tool_choice="required", temperature=0, max_tokens=120, extra_body={"tool_format": "hermes"}) as stream:
        events = [ev.type for ev in stream]
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert "tool_calls.function.arguments.delta" in events


def test_tool_choice_none_shows_the_tools_and_parses_nothing(url, monkeypatch):
    # vLLM >= 0.10: the tools stay in the prompt, the reply is content only (docs/tools.md)
    import aicirt.serve.protocol as PR
    seen = {}
    real = PR.chat_tokens

    def spy(backend, messages, tools=None, fam=None):
        seen["tools"] = tools
        return real(backend, messages, tools, fam)
    monkeypatch.setattr(PR, "chat_tokens", spy)
    r = chat(url, call_text("get_weather", {"city": "Rome"}), tools=[WEATHER], tool_choice="none")
    assert [t.name for t in seen["tools"]] == ["get_weather"]
    msg = r["choices"][0]["message"]
    assert "tool_calls" not in msg and msg["content"] == call_text("get_weather", {"city": "Rome"})
    assert r["choices"][0]["finish_reason"] == "stop"


def test_openai_client_reads_tool_calls(url):
    import openai   # the dev extra
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "SAY:hello|"}], tools=[WEATHER], tool_choice="required",
        temperature=0, max_tokens=80, extra_body={"tool_format": "generic"})
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])


# --- stop, n, logprobs ------------------------------------------------------------------------------
def test_stop_strings_cut_the_text(url):
    r = complete(url, "Hello world. Bye", stop=["world", "zzz"])
    assert r["choices"][0]["text"] == "Hello " and r["choices"][0]["finish_reason"] == "stop"
    r = chat(url, "one, two, three", stop=", t")
    assert r["choices"][0]["message"]["content"] == "one"
    chunks = stream_chunks(url, "/v1/completions", {"prompt": "SAY:Hello world. Bye|", "stop": "world",
                                                    "stream": True, "temperature": 0, "max_tokens": 40})
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "Hello "


def test_n_forks_one_choice_each(url):
    r = chat(url, "prose", n=3, response_format={"type": "json_object"}, temperature=1.0, seed=3)
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    for c in r["choices"]:
        assert isinstance(json.loads(c["message"]["content"]), dict)
    r = complete(url, "abc", n=2)
    assert [c["text"] for c in r["choices"]] == ["abc", "abc"]


def test_usage_counts_every_choice_of_n_forks_and_the_prompt_once(url):
    one = complete(url, "abc")["usage"]
    assert one["completion_tokens"] == 4                      # a, b, c and EOS (the scripted tokenizer: bytes)
    three = complete(url, "abc", n=3)["usage"]
    assert three == {"prompt_tokens": one["prompt_tokens"], "completion_tokens": 12,
                     "total_tokens": one["prompt_tokens"] + 12}
    cut = complete(url, "abcdef", n=2, max_tokens=4)
    assert [c["finish_reason"] for c in cut["choices"]] == ["length"] * 2 and cut["usage"]["completion_tokens"] == 8
    r = chat(url, "prose", n=2, response_format={"type": "json_object"})
    # the program ends each choice after its object (no EOS sampled): its bytes are its tokens
    assert r["usage"]["completion_tokens"] == sum(len(c["message"]["content"].encode()) for c in r["choices"])
    chunks = stream_chunks(url, "/v1/completions", {"prompt": "SAY:abc|", "n": 3, "stream": True, "temperature": 0,
                                                    "max_tokens": 20, "stream_options": {"include_usage": True}})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == three


def test_logprobs_chat_and_completions(url):
    r = chat(url, "Hi there", logprobs=True, top_logprobs=2)
    c = r["choices"][0]
    toks = c["logprobs"]["content"]
    assert "".join(t["token"] for t in toks) == c["message"]["content"] == "Hi there"
    for t in toks:
        assert t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 and t["top_logprobs"][0]["token"] == t["token"]
        assert bytes(t["bytes"]).decode() == t["token"]
    r = complete(url, "abc", logprobs=1, stop="c")
    lp = r["choices"][0]["logprobs"]
    assert lp["tokens"] == ["a", "b"] and lp["text_offset"] == [0, 1] and len(lp["top_logprobs"][0]) == 1
    # forced text (fast-forwarded by the program) has probability 1 under its constraint
    r = chat(url, "x", logprobs=True, response_format={"type": "structural_tag",
                                                        "format": {"type": "const_string", "value": "OK"}})
    assert [t["logprob"] for t in r["choices"][0]["logprobs"]["content"]] == [0.0, 0.0]


# --- what cannot be honoured ------------------------------------------------------------------------
@pytest.mark.parametrize("path, body, needle", [
    ("/v1/chat/completions", {"frequency_penalty": 0.5}, "frequency_penalty: not supported"),
    ("/v1/chat/completions", {"logit_bias": {"1": 5}}, "logit_bias: not supported"),
    ("/v1/chat/completions", {"functions": []}, "functions: not a field aicirt serve honours (use tools)"),
    ("/v1/chat/completions", {"wat": 1}, "wat: not a field aicirt serve honours"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs: needs logprobs: true"),
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type: 'xml' is not"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format.json_schema: must be"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "guided_regex": "a"},
     "guided_regex: only one output constraint"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "controller": "regex"},
     "controller: cannot be combined"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "'x' is not one of the tools"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice: given without tools"),
    ("/v1/completions", {"tools": [WEATHER]}, "tools: tool calling is a chat feature"),
    ("/v1/completions", {"best_of": 2}, "best_of: not supported"),
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    # malformed programs and schemas: the program controller's reason, with its JSON pointer
    ("/v1/chat/completions", {"response_format": {"type": "structural_tag", "format": {"type": "nope"}}},
     "unknown type \"nope\""),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}},
     "at /format/json_schema: json_schema: bad schema: $ref at #/properties/a (no such location)"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}], "tool_choice": "required", "max_tokens": 100}, "unknown type name"),
    ("/v1/chat/completions", {"response_format": {"type": "grammar", "grammar": "start: x"}},
     "grammar: line 1: undefined rule x"),
    ("/v1/chat/completions", {"guided_grammar": "start: \"a\"\nstart: y"}, "grammar: line"),
])
def test_unhonoured_or_malformed_fields_are_400s_naming_them(url, path, body, needle):
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    r = httpx.post(url + path, json={**base, "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert needle in r.json()["message"], r.json()["message"]


def test_no_op_values_of_unhonoured_fields_are_accepted(url):
    r = chat(url, "ok", frequency_penalty=0, presence_penalty=0.0, logit_bias={}, user="u", metadata={"a": "b"})
    assert r["choices"][0]["message"]["content"] == "ok"


# --- any combination: an answer or a 400, never a 500 -----------------------------------------------
def _garbled_bodies():
    from hypothesis import strategies as st

    leaf = st.none() | st.booleans() | st.integers(-3, 30) | st.text(max_size=8)
    anything = st.recursive(leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                            max_leaves=8)
    schema = st.sampled_from([{"type": "object"}, {"type": "string"}, {"enum": [1, "a"]}, {"type": "strin"},
                              {"$ref": "#/x"}, {"type": "object", "properties": {"a": {"type": "integer"}}}])
    fmt = st.sampled_from([{"type": "const_string", "value": "hi"}, {"type": "regex", "pattern": "[a-"},
                           {"type": "any_text", "max_tokens": 2}, {"type": "nope"}, {"type": "or", "elements": []}])
    response_format = st.one_of(
        st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "grammar", "grammar": "x"}]),
        st.builds(lambda s, strict: {"type": "json_schema", "json_schema": {"name": "n", "schema": s, "strict": strict}},
                  schema, anything),
        st.builds(lambda f: {"type": "structural_tag", "format": f}, fmt), anything)
    tool = st.one_of(st.just(WEATHER), st.builds(
        lambda n, p: {"type": "function", "function": {"name": n, "parameters": p}},
        st.sampled_from(["f", "a b", "", "g" * 70]), schema | anything), anything)
    fields = {"response_format": response_format, "tools": st.lists(tool, max_size=3) | anything,
              "tool_choice": st.sampled_from(["auto", "none", "required", "x", {"type": "function",
                                               "function": {"name": "get_weather"}}]) | anything,
              "parallel_tool_calls": st.booleans() | anything, "n": st.integers(0, 18) | anything,
              "stop": st.lists(st.text(max_size=3), max_size=3) | anything, "logprobs": st.booleans() | anything,
              "top_logprobs": st.integers(-1, 22) | anything, "tool_format": st.sampled_from(["hermes", "xml"]) | anything,
              "guided_regex": st.sampled_from(["[0-9]+", "("]) | anything, "stream": st.booleans()}
    return st.fixed_dictionaries({}, optional=fields)


def test_any_combination_of_structured_fields_is_an_answer_or_a_400(url):
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(_garbled_bodies())
    def check(body):
        r = httpx.post(url + "/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "SAY:hi|"}], "max_tokens": 3, **body})
        assert r.status_code in (200, 400), (body, r.text)
        if r.status_code == 400:
            assert r.json()["message"]

    check()
