"""`aicirt run json`: a schema the controller rejects is reported before the model loads; the
shipped controller runs end to end under the engine (scripted model; the real one under -m slow)."""
from __future__ import annotations

import io
import json

import pytest

from aicirt.runner import run as run_command
from aicirt.engine import Engine
from aicirt.engine.backends.scripted import ScriptedBackend
from aicirt.build.toolchain import build_cached


def test_unsupported_schema_is_reported_before_the_model_loads(monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr("aicirt.engine.backends.load_backend", no_model)
    with pytest.raises(run_command.RunFailed, match=r"json: unsupported: not at #/properties/a"):
        run_command.run("json", arg=b'{"properties": {"a": {"not": {"pattern": "x"}}}}', model="scripted",
                        out=io.StringIO(), err=io.StringIO())
    with pytest.raises(run_command.RunFailed, match=r"json: bad schema: not JSON"):
        run_command.run("json", arg=b"{", model="scripted", out=io.StringIO(), err=io.StringIO())


def test_cli_arg_file(tmp_path):
    from click.testing import CliRunner

    import cli
    bad = tmp_path / "schema.json"
    bad.write_text(json.dumps({"type": "string", "format": "hostname-idn"}))
    r = CliRunner().invoke(cli.main, ["run", "json", "--arg-file", str(bad), "-m", "scripted"])
    assert r.exit_code != 0 and "unsupported: format at #/format (hostname-idn)" in r.output


def test_json_under_the_scripted_engine_writes_a_valid_document():
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "n"], "additionalProperties": False}
    prompt = "Q: "
    want = '{"name":"Ada","n":42}'
    script = list(prompt.encode()) + list(want.encode()) + [256] + [0] * 32
    eng = Engine(ScriptedBackend(script=script))
    try:
        req = eng.generate(prompt, controller=str(build_cached("json")), arg=json.dumps(schema).encode(), chat=False)
    finally:
        eng.close()
    s = req.sequences[0]
    assert s.finish_reason == "stop", (s.error, s.logs)
    assert json.loads(s.text_bytes) == {"name": "Ada", "n": 42}


@pytest.mark.slow
def test_aicirt_run_json_on_the_default_model(tmp_path):
    pytest.importorskip("transformers")
    import jsonschema   # the dev extra
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
                                               "country": {"type": "string", "enum": ["France", "Germany", "Italy"]}},
              "required": ["city", "population", "country"], "additionalProperties": False}
    try:
        result = run_command.run("json", arg=json.dumps(schema).encode(), prompt="Describe Paris as JSON.",
                                 max_tokens=96, as_json=True, out=io.StringIO(), err=io.StringIO())
    except FileNotFoundError as e:
        pytest.skip(str(e))
    text = result["sequences"][0]["text"]
    jsonschema.validate(json.loads(text), schema)
