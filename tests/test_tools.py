"""aicirt.program.tools: OpenAI tools + tool_choice rendered into structural-tag formats per family,
replies parsed back into tool_calls, bad input refused naming the field. No model, no controller."""
from __future__ import annotations

import json

import pytest

from aicirt.program import tools as T

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def tools():
    return T.tools_from_openai([WEATHER, TIME])


# --- rendering ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fam, begin, end", [
    (T.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": ', "}\n</tool_call>"),
    (T.LLAMA3, '{"name": "get_weather", "parameters": ', "}"),
    (T.GENERIC, '<tool_call>{"name": "get_weather", "arguments": ', "}</tool_call>"),
])
def test_named_choice_is_one_tag_with_the_tools_schema(fam, begin, end):
    ts = tools()
    fmt = T.render(ts, T.choice_from_openai({"type": "function", "function": {"name": "get_weather"}}, ts), fam=fam)
    assert fmt == {"type": "tag", "begin": begin, "end": end,
                   "content": {"type": "json_schema", "json_schema": WEATHER["function"]["parameters"],
                               "x-coerce-one-of": True}}
    # begin + some arguments + end is one JSON object (after the tag, if any): what parse reads back
    text = begin + '{"city": "Oslo"}' + end
    assert T.parse(text, fam)[1][0].name == "get_weather"


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_is_triggered_tags(parallel):
    for fam in (T.HERMES, T.LLAMA3, T.GENERIC):
        fmt = T.render(tools(), "auto", parallel=parallel, fam=fam)
        assert fmt["type"] == "triggered_tags" and fmt["triggers"] == [fam.trigger]
        assert fmt["at_least_one"] is False and fmt["stop_after_first"] is not parallel
        assert [t["begin"] for t in fmt["tags"]] == [fam.call_begin("get_weather"), fam.call_begin("get_time")]
        # every tag's begin starts with the trigger (XGrammar's rule for triggered_tags)
        assert all(t["begin"].startswith(fam.trigger) for t in fmt["tags"])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_is_calls_only_joined_by_the_separator(parallel):
    for fam in (T.HERMES, T.LLAMA3, T.GENERIC):
        fmt = T.render(tools(), "required", parallel=parallel, fam=fam)
        assert fmt == {"type": "tags_with_separator", "tags": T.render(tools(), "auto", fam=fam)["tags"],
                       "separator": fam.separator, "at_least_one": True, "stop_after_first": not parallel}
        # two calls joined by the separator parse back as two calls and no content
        text = fam.separator.join(fam.call_begin(n) + "{}" + fam.end for n in ("get_weather", "get_time"))
        assert [c.name for c in T.parse(text, fam)[1]] == ["get_weather", "get_time"]
        assert T.parse(text, fam)[0] is None


def test_none_adds_no_constraint():
    assert T.render(tools(), "none") is None


def test_a_tool_without_parameters_takes_an_object():
    (t,) = T.tools_from_openai([{"type": "function", "function": {"name": "ping"}}])
    assert t.parameters == {"type": "object"}


# --- detection ------------------------------------------------------------------------------------
QWEN = ("{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}{{ tool | tojson }}{%- endfor %}"
        "For each function call, return a json object within <tool_call></tool_call> XML tags{%- endif %}")
LLAMA = ("{%- if tools is not none %}Environment: ipython{%- endif %}{{- '{\"name\": \"' + tool_call.name + "
         "'\", \"parameters\": ' }}<|python_tag|>")
SMOL = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>{% endfor %}"


@pytest.mark.parametrize("template, fam", [(QWEN, T.HERMES), (LLAMA, T.LLAMA3), (SMOL, T.GENERIC), (None, T.GENERIC),
                                           ("<tool_call> mentioned but no tools variable", T.GENERIC)])
def test_detect_family_from_the_chat_template(template, fam):
    assert T.detect_family(template) is fam


def test_generic_family_describes_the_tools_in_a_system_message():
    msg = T.system_message(tools(), T.GENERIC)
    assert '"name": "get_weather"' in msg and '"required": ["city"]' in msg
    assert '<tool_call>{"name": "NAME", "arguments": {...}}</tool_call>' in msg
    assert T.GENERIC.system_prompt and not T.HERMES.system_prompt


# --- parsing --------------------------------------------------------------------------------------
def test_parse_hermes_text_and_parallel_calls():
    text = ('Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    content, calls = T.parse(text, T.HERMES)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    assert calls[0].as_openai() == {"id": calls[0].id, "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def test_parse_llama3_calls_joined_by_semicolons():
    text = '{"name": "get_weather", "parameters": {"city": "Rome"}}; {"name": "get_time", "parameters": {}}'
    content, calls = T.parse(text, T.LLAMA3)
    assert content is None and [c.name for c in calls] == ["get_weather", "get_time"]


def test_parse_leaves_what_is_not_a_call_in_the_content():
    for text in ["plain answer", "<tool_call> not json", '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "f", "arguments": "not an object"}</tool_call>', "<tool_call>"]:
        content, calls = T.parse(text, T.GENERIC)
        assert calls == [] and content == text.strip()
    assert T.parse("   ", T.HERMES) == (None, [])


def test_parse_keeps_a_truncated_call_as_text():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    assert T.parse(text, T.HERMES) == (text, [])


def test_parse_unicode_arguments_round_trip():
    _, calls = T.parse('<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>', T.GENERIC)
    assert json.loads(calls[0].arguments) == {"city": "Zürich"} and "Zürich" in calls[0].arguments


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, needle", [
    ([], "tools: must be a non-empty list"),
    ("x", "tools: must be a non-empty list"),
    ([{"type": "code_interpreter"}], "tools[0]: must be"),
    ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name: 'a b' is not"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name"),
    ([WEATHER, WEATHER], "tools[1].function.name: 'get_weather' is defined twice"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools[0].function.parameters: must be"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], "must be an object"),
    ([{"type": "function", "function": {"name": "f", "args": {}}}], "unknown field(s) args"),
    ([{"type": "function", "function": {"name": "f", "strict": "yes"}}], "strict: must be true or false"),
])
def test_bad_tools_name_the_field(bad, needle):
    with pytest.raises(T.ToolError) as e:
        T.tools_from_openai(bad)
    assert needle in str(e.value)


@pytest.mark.parametrize("bad, needle", [
    ("sometimes", "tool_choice: \"sometimes\" is not"),
    ({"type": "function", "function": {"name": "nope"}}, "'nope' is not one of the tools (get_weather, get_time)"),
    ({"type": "function"}, "tool_choice.function.name: missing"),
])
def test_bad_tool_choice_names_the_field(bad, needle):
    with pytest.raises(T.ToolError) as e:
        T.choice_from_openai(bad, tools())
    assert needle in str(e.value)


def test_choice_values():
    ts = tools()
    assert [T.choice_from_openai(c, ts) for c in (None, "auto", "none", "required")] == \
        ["auto", "auto", "none", "required"]
    assert T.choice_from_openai({"type": "function", "function": {"name": "get_time"}}, ts) == "function:get_time"
    with pytest.raises(T.ToolError, match="tool_format: unknown tool-call format 'xml'"):
        T.family("xml")


def test_tool_calls_builder_entry_point():
    fmt = T.tool_calls([WEATHER, TIME], "required", parallel=False, family="llama3")
    assert fmt == T.render(tools(), "required", parallel=False, fam=T.LLAMA3)
    assert T.tool_calls([WEATHER], {"type": "function", "function": {"name": "get_weather"}})["type"] == "tag"
    assert T.tool_calls([WEATHER], "none") == {"type": "any_text"}
    from aicirt.program import as_format, validate

    validate({"type": "structural_tag", "format": as_format(fmt).to_json()})     # the program's own checker agrees
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_time"}}):
        for fam in T.FAMILIES:
            validate(T.tool_calls([WEATHER, TIME], choice, family=fam))
    with pytest.raises(T.ToolError, match="tool_format: unknown"):
        T.tool_calls([WEATHER], family="xml")


# --- streaming: incremental deltas ------------------------------------------------------------------
STREAMED = [
    (T.HERMES, 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city":"Nice","x":{"a":[1,{"b":"}"}]}}}\n'
               '</tool_call>\n<tool_call>\n{"name": "t", "arguments": {}}\n</tool_call>'),
    (T.HERMES, "no calls here <tool_ca"),
    (T.HERMES, "<tool_call> not a call after all"),
    (T.LLAMA3, '{"name": "f", "parameters": {"a":1}}; {"name": "g", "parameters": {"b":"x"}}'),
    (T.GENERIC, '  hi <tool_call>{"name": "f", "arguments": {"q":"}</tool_call>"}}</tool_call> bye  '),
]


@pytest.mark.parametrize("fam,text", STREAMED)
@pytest.mark.parametrize("step", [1, 4, 9])
def test_streamed_deltas_add_up_to_the_parsed_reply(fam, text, step):
    from aicirt.program.tool_stream import ToolStream
    s = ToolStream(fam)
    deltas = [d for i in range(step, len(text) + step, step) for d in s.feed(text[:i], final=i >= len(text))]
    content = "".join(d["content"] for d in deltas if "content" in d) or None
    calls: dict[int, list] = {}
    for d in deltas:
        if "tool_call" in d:
            e = d["tool_call"]
            if "id" in e:                                  # a call's first entry: its header
                assert e["index"] not in calls and e["function"]["arguments"] == "" and e["type"] == "function"
                calls[e["index"]] = [e["function"]["name"], ""]
            else:
                assert set(e) == {"index", "function"} and set(e["function"]) == {"arguments"}
                calls[e["index"]][1] += e["function"]["arguments"]
    ref_content, ref_calls = T.parse(text, fam)
    assert content == ref_content
    assert [(n, json.loads(a)) for n, a in calls.values()] == [(c.name, json.loads(c.arguments)) for c in ref_calls]
    assert s.calls == len(ref_calls)


def test_streamed_arguments_never_include_the_call_s_end():
    from aicirt.program.tool_stream import ToolStream
    s = ToolStream(T.HERMES)
    text = '<tool_call>\n{"name": "f", "arguments": {"a": {"b": 1}}}\n</tool_call>'
    sent = ""
    for i in range(1, len(text) + 1):
        for d in s.feed(text[:i]):
            if "tool_call" in d and "id" not in d["tool_call"]:
                sent += d["tool_call"]["function"]["arguments"]
        assert '{"a": {"b": 1}}'.startswith(sent)          # a held "}" may still be the call's end
    assert sent == '{"a": {"b": 1}}'


def test_the_arguments_are_completed_by_the_reply_s_max_tokens():
    tools = T.tools_from_openai([WEATHER])
    fmt = T.render(tools, "required", fam=T.HERMES, complete_by=128)
    assert all(t["content"]["complete_by"] == 128 and t["content"]["x-coerce-one-of"] for t in fmt["tags"])
    assert "complete_by" not in T.render(tools, "required", fam=T.HERMES)["tags"][0]["content"]
