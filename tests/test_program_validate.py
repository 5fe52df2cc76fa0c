"""A malformed program: one validator, the `program` controller's first call, reached from Python.
`aicirt.program.validate`, `program_arg`, `run`, the CLI and the server's OpenAI routes all report
the controller's own pointer and words ("program: at POINTER: WHY"); Python keeps no copy of the
rules."""
from __future__ import annotations

import io
import json

import httpx
import pytest

import aicirt
from aicirt import Capabilities, StepInput
from aicirt.runner import run as run_command
from aicirt import program as P
from aicirt.build.toolchain import build_cached

T = {"type": "const_string", "value": "x"}
BAD = [
    ({"type": "foo"}, "/type", 'unknown type "foo"'),
    ({"value": "x"}, "/", 'missing "type"'),
    ([1, 2], "/", 'a format must be an object with a "type"'),
    ({"type": "structural_tag"}, "/", 'missing "format"'),
    ({"type": "structural_tag", "format": {"type": "sequence", "elements": [T, {"type": "regex"}]}},
     "/format/elements/1", 'missing "pattern"'),
    ({"type": "const_string", "value": 3}, "/value", "must be a string"),
    ({"type": "sequence", "elements": [T, {"type": "or", "elements": []}]}, "/elements/1/elements", "must not be empty"),
    ({"type": "grammar"}, "/", 'missing "grammar"'),
    ({"type": "grammar", "grammar": 5}, "/grammar", "must be a string"),
    ({"type": "any_text", "max_tokens": -2}, "/max_tokens", "must be a non-negative integer"),
    ({"type": "any_text", "max_chars": 5}, "/max_chars", "max_chars is not supported"),
    ({"type": "repeat", "min": 3, "max": 2, "content": T}, "/", '"max" is below "min"'),
    ({"type": "repeat", "min": 1, "content": T}, "/", 'missing "max"'),
    ({"type": "star", "content": "x"}, "/content", "must be an object"),
    ({"type": "tag", "begin": "<a>", "content": T}, "/", 'missing "end"'),
    ({"type": "tag", "begin": "<a>", "content": {"type": "nope"}, "end": "</a>"}, "/content/type", "unknown type"),
    ({"type": "tag", "begin": "<a>", "content": T, "end": 5}, "/end", "must be a string, a list of strings"),
    ({"type": "triggered_tags", "triggers": ["<f="], "tags": [{"begin": "<g>", "content": T, "end": "</g>"}]},
     "/tags/0/begin", "does not start with any of the triggers"),
    ({"type": "triggered_tags", "triggers": [], "tags": []}, "/triggers", "must not be empty"),
    ({"type": "tags_with_separator", "tags": [{"begin": "<a>", "content": T, "end": "</a>"}]}, "/",
     'missing "separator"'),
    ({"type": "json_schema"}, "/", 'missing "json_schema"'),
    ({"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}, "/style", 'only style "json" is supported'),
    ({"type": "fork", "branches": []}, "/branches", "must hold 1 to 16 formats"),
    ({"type": "wait", "vars": []}, "/", 'missing "vars"'),
    ({"type": "const_string", "value": "x", "temperature": -1}, "/temperature", "must be a number from 0 to 100"),
    ({"type": "const_string", "value": "x", "name": ""}, "/name", "must be a non-empty string"),
    ({"type": "const_string", "value": "x", "name": "a", "capture": "add"}, "/capture", 'must be "set" or "append"'),
    ({"type": "any_text", "stop": [""]}, "/stop/0", "must not be empty"),
    ({"type": "sequence", "elements": [{"type": "backtrack", "to": "L"}, dict(T, label="L")]}, "/elements/0/to",
     "no label before this step is called L"),
    ({"type": "sequence", "elements": [dict(T, label="L"), {"type": "or", "elements": [dict(T, label="L")]}]},
     "/elements/1/elements/0/label", "label defined twice: L"),
    ({"type": "sequence", "elements": [dict(T, label=3)]}, "/elements/0/label", "must be a non-empty string"),
    ({"type": "sequence", "elements": [dict(T, label="L"), {"type": "backtrack"}]}, "/elements/1", 'missing "to"'),
    ({"type": "sequence", "elements": [dict(T, label="L"), {"type": "backtrack", "to": "L", "text": ["a", {"var": ""}]}]},
     "/elements/1/text/1", 'must be a string or {"var": NAME}'),
    ({"type": "sequence", "elements": [dict(T, label="L"), {"type": "backtrack", "to": "L", "text": 5}]},
     "/elements/1/text", "must be a string or a list of strings"),
    ({"type": "sequence", "elements": [{"type": "const_string", "value": "a/b", "x": 1},
                                       {"type": "optional", "content": {"type": "plus"}}]},
     "/elements/1/content", 'missing "content"'),
]


@pytest.fixture(scope="module")
def first_call():
    """The controller's log from its first call on `arg` (the byte tokenizer), straight from the runtime."""
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), limits=aicirt.Limits(soft_deadline_s=5.0), cache_dir=False)
    ctrl = rt.load(build_cached("program"))

    def call(arg: bytes) -> str:
        req = rt.new_request(ctrl, arg=arg, capabilities=Capabilities.ALL)
        seq = req.spawn()
        r = rt.submit([StepInput(seq, list(b"Q"), None)]).wait().results[0]
        assert r.is_stop
        return r.logs
    yield call
    rt.close()


@pytest.mark.parametrize("prog,pointer,why", BAD)
def test_validate_raises_the_controller_s_own_line(prog, pointer, why, first_call):
    with pytest.raises(P.ProgramError) as e:
        P.validate(prog)
    assert e.value.pointer == pointer and e.value.why.startswith(why), str(e.value)
    assert first_call(json.dumps(prog).encode()) == f"program: {e.value}\n"
    with pytest.raises(P.ProgramError) as again:       # program_arg: the same check, the same error
        P.program_arg(json.dumps(prog))
    assert str(again.value) == str(e.value)


def test_not_json(first_call):
    with pytest.raises(P.ProgramError, match=r"at /: not JSON"):
        P.validate(b"{")
    assert first_call(b"{").startswith("program: at /: not JSON")
    with pytest.raises(P.ProgramError, match=r"at /: not JSON"):
        P.program_arg({"type": "const_string", "value": {1, 2}})      # not writable as JSON


@pytest.mark.parametrize("prog,pointer,why", [
    ({"type": "sequence", "elements": [{"type": "regex", "pattern": "(("}]}, "/elements/0/pattern",
     "regex: missing ) at offset 2"),
    ({"type": "json_schema", "json_schema": {"not": {"pattern": "x"}}}, "/json_schema", "json_schema: unsupported: not"),
    ({"type": "sequence", "elements": [{"type": "grammar", "grammar": 'start: x\nx: "a"\n%declare FOO\n'}]},
     "/elements/0/grammar", "grammar: line 3: unsupported: %declare"),
    ({"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>", "content": {
        "type": "json_schema", "json_schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}},
     "/format/content/json_schema", "json_schema: bad schema: $ref at #/properties/a (no such location)"),
])
def test_regex_schema_and_grammar_errors_are_program_errors_too(prog, pointer, why, first_call):
    """What Python's copy could not check (it needs the controller's compilers) is now the same
    ProgramError: one check, the controller's."""
    with pytest.raises(P.ProgramError) as e:
        P.validate(prog)
    assert e.value.pointer == pointer and e.value.why.startswith(why), str(e.value)
    assert first_call(json.dumps(prog).encode()) == f"program: {e.value}\n"


def test_the_stand_in_leaves_vocabulary_questions_to_the_model_s_tokenizer():
    """On the byte stand-in a token text that is not one of its tokens, or an id past its 257, is
    not refused (the model may have it); on a runtime over the tokenizer in question it is."""
    for prog in ({"type": "token", "token": "<|im_end|>"}, {"type": "exclude_token", "exclude_tokens": [5000]}):
        P.validate(prog)
    with pytest.raises(P.ProgramError, match=r"at /token: a token is an id below the vocabulary size"):
        P.validate({"type": "token", "token": -1})                    # no vocabulary has it
    with pytest.raises(P.ProgramError, match=r"at /exclude_tokens/0: a token is an id below"):
        P.validate({"type": "exclude_token", "exclude_tokens": [True]})
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), workers=1, prebuild_trie=False)
    try:
        with pytest.raises(P.ProgramError) as e:
            P.validate({"type": "token", "token": "<|im_end|>"}, rt)  # the caller's runtime: the exact verdict
        assert (e.value.pointer, e.value.why) == ("/token", "not one token in this tokenizer: <|im_end|>")
        with pytest.raises(P.ProgramError, match=r"at /exclude_tokens/0: a token is an id below"):
            P.validate({"type": "exclude_token", "exclude_tokens": [5000]}, rt)
        with pytest.raises(P.ProgramError) as e:                      # the quoted text keeps its newline
            P.validate({"type": "sequence", "elements": [T, {"type": "token", "token": "a\nb"}]}, rt)
        assert (e.value.pointer, e.value.why) == ("/elements/1/token", "not one token in this tokenizer: a\nb")
    finally:
        rt.close()


def test_capabilities_are_the_controller_s_verdict_too():
    prog = P.seq("x", P.fork("a", P.seq(P.label("L", "b"), P.backtrack("L", "c"))))
    assert P.required_capabilities(prog.to_json()) == {"fork": "/elements/1", "backtrack": "/elements/1/branches/1/elements/1",
                                                       "ff_tokens": "/elements/1/branches/1/elements/1"}
    with pytest.raises(P.ProgramError) as e:
        P.validate(prog.to_json(), capabilities=Capabilities.FF_TOKENS | Capabilities.BACKTRACK)
    assert str(e.value) == "at /elements/1: fork needs capability `fork`, which this host did not grant"
    with pytest.raises(P.ProgramError, match=r"at /elements/0/type: unknown type"):
        P.capability_refusal({"type": "sequence", "elements": [{"type": "nope"}, {"type": "fork", "branches": [T]}]},
                             Capabilities.FF_TOKENS)


def test_good_programs_validate():
    P.validate(P.structural_tag(P.seq(P.think(max_tokens=8), P.json({"type": "object"}))))
    P.validate(P.fork(P.seq(P.wait("a"), "done"), P.gen(name="a", stop="\n")).to_json())
    assert P.required_capabilities(P.seq("a", P.fork("b")).to_json()) == {"fork": "/elements/1"}
    assert P.program_arg(P.seq("a", P.gen(regex="[0-9]"))) == \
        b'{"type": "sequence", "elements": [{"type": "const_string", "value": "a"}, {"type": "regex", "pattern": "[0-9]"}]}'


def test_cli_refuses_a_bad_program_before_the_model_loads(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import cli
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"type": "structural_tag", "format": {"type": "sequence", "elements": [{"type": "tag"}]}}))

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr("aicirt.engine.backends.load_backend", no_model)
    r = CliRunner().invoke(cli.main, ["run", "program", "--arg-file", str(bad), "-m", "scripted"])
    assert r.exit_code != 0 and "program: at /format/elements/0: missing \"begin\"" in r.output


def test_run_on_the_scripted_model():
    res = P.run(P.seq("A: ", P.select(["yes", "no"], name="answer")), prompt="Q", model="scripted", chat=False)
    assert res.text in ("A: yes", "A: no") and res.variables["answer"] == res.text[3:]
    with pytest.raises(P.ProgramError, match=r"at /elements/1/type: unknown type"):
        P.run({"type": "sequence", "elements": [T, {"type": "bogus"}]}, model="scripted")


def test_run_reports_a_refusal_on_the_model_s_tokenizer_as_a_program_error(monkeypatch):
    """What the stand-in leaves open (a token the model's vocabulary may lack) is decided by the
    run's first call on the model's tokenizer, before the weights load: the same ProgramError."""
    def no_model(*a, **k):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr("aicirt.engine.backends.load_backend", no_model)
    with pytest.raises(P.ProgramError) as e:
        P.run({"type": "sequence", "elements": [T, {"type": "token", "token": 4000}]}, model="scripted")
    assert str(e.value) == "at /elements/1/token: a token is an id below the vocabulary size or its text"
    assert isinstance(e.value.__cause__, run_command.RunFailed)


def test_run_command_reports_the_pointer(monkeypatch):
    with pytest.raises(run_command.RunFailed, match=r"program: at /elements/0: missing \"value\""):
        run_command.run("program", arg=b'{"type":"sequence","elements":[{"type":"const_string"}]}', model="scripted",
                        out=io.StringIO(), err=io.StringIO())


def test_docs_session_is_what_the_cli_prints():
    """docs/program.md's refused program: the Error line is what `aicirt run` prints today."""
    import re
    import shlex
    from pathlib import Path

    from click.testing import CliRunner

    import cli
    doc = (Path(__file__).resolve().parent.parent / "docs" / "program.md").read_text()
    block = re.search(r"```console\n\$ aicirt (run program .*?)\n(Error: .*?)\n```", doc, re.S)
    assert block, "docs/program.md lost its console session"
    r = CliRunner().invoke(cli.main, shlex.split(block.group(1)))
    assert r.exit_code != 0 and block.group(2) in r.output, r.output


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    from _server_helpers import live_server

    from aicirt.engine.backends import ScriptedBackend
    from aicirt.serve.settings import Settings

    settings = Settings(store=str(tmp_path_factory.mktemp("store")), max_context=2048, max_batch=4, max_queue=4)
    with live_server(settings, backend=ScriptedBackend(script="ok")) as (base, _):
        yield base


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("prog,pointer,why", [
    ({"type": "sequence", "elements": [T, {"type": "or", "elements": []}]}, "/format/elements/1/elements",
     "must not be empty"),
    ({"type": "triggered_tags", "triggers": ["<f="], "tags": [{"begin": "<g>", "content": T, "end": "</g>"}]},
     "/format/tags/0/begin", "does not start with any of the triggers"),
    ({"type": "repeat", "min": 3, "max": 2, "content": T}, "/format", '"max" is below "min"'),
    ({"type": "regex", "pattern": "(("}, "/format/pattern", "regex: missing ) at offset 2"),
])
def test_the_server_answers_400_with_the_controller_s_words(server_url, prog, pointer, why, stream):
    """The OpenAI route's structural tag: the controller's first call on the server's own runtime
    refuses it, and the 400 (before anything streams) leads with its line."""
    r = httpx.post(server_url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream,
        "response_format": {"type": "structural_tag", "format": prog}})
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert message.startswith(f"program: at {pointer}: {why}"), message
    with pytest.raises(P.ProgramError) as e:                 # the Python API says the same
        P.validate({"type": "structural_tag", "format": prog})
    assert message.startswith(f"program: {e.value}")


def test_the_server_refuses_n_copies_of_a_bad_format_naming_the_fork_branch(server_url):
    r = httpx.post(server_url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2,
        "response_format": {"type": "structural_tag", "format": {"type": "const_string", "value": 3}}})
    assert r.status_code == 400, r.text
    assert r.json()["message"].startswith("program: at /format/branches/0/value: must be a string"), r.text
