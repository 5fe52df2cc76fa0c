"""A malformed program: `aicirt.program.validate` and the controller's first call name the same JSON
pointer with the same words; the CLI and `run` refuse it before the model loads."""
from __future__ import annotations

import io
import json

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
    """The controller's log from its first call on `arg` (the byte tokenizer)."""
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
def test_python_and_the_controller_name_the_same_pointer_and_reason(prog, pointer, why, first_call):
    with pytest.raises(P.ProgramError) as e:
        P.validate(prog)
    assert e.value.pointer == pointer and e.value.why.startswith(why), str(e.value)
    assert first_call(json.dumps(prog).encode()) == f"program: {e.value}\n"


def test_not_json(first_call):
    with pytest.raises(P.ProgramError, match=r"at /: not JSON"):
        P.validate(b"{")
    assert first_call(b"{").startswith("program: at /: not JSON")


def test_regex_and_schema_errors_come_from_the_first_call(first_call):
    prog = {"type": "sequence", "elements": [{"type": "regex", "pattern": "(("}]}
    P.validate(prog)                                  # the shape is fine; the regex compiler says no
    assert first_call(json.dumps(prog).encode()) == "program: at /elements/0/pattern: regex: missing ) at offset 2\n"
    prog = {"type": "json_schema", "json_schema": {"not": {"pattern": "x"}}}   # (not {} is now "admits no document")
    assert first_call(json.dumps(prog).encode()).startswith("program: at /json_schema: json_schema: unsupported: not")
    prog = {"type": "sequence", "elements": [{"type": "grammar", "grammar": 'start: x\nx: "a"\n%declare FOO\n'}]}
    P.validate(prog)
    assert first_call(json.dumps(prog).encode()) == \
        "program: at /elements/0/grammar: grammar: line 3: unsupported: %declare\n"


def test_good_programs_validate():
    P.validate(P.structural_tag(P.seq(P.think(max_tokens=8), P.json({"type": "object"}))))
    P.validate(P.fork(P.seq(P.wait("a"), "done"), P.gen(name="a", stop="\n")).to_json())
    assert P.required_capabilities(P.seq("a", P.fork("b")).to_json()) == {"fork": "/elements/1"}


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
