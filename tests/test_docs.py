"""The docs' code runs: docs/embedding.md's step loop, on a scripted controller."""
from __future__ import annotations

import re
from pathlib import Path

from scripted import branch, by_fork_index, result, script, splice, stop, var_set


DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_embedding_step_loop_runs(scripted_wasm, capsys):
    text = (DOCS / "embedding.md").read_text()
    code = re.search(r"## The whole loop.*?```python\n(.*?)```", text, re.S).group(1)
    arg = script(result(branch(mask=[ord("a"), ord("b")], temperature=0.0), branch(splices=[splice(ff=[ord("!")])])),
                 by_fork_index(var_set("done", "yes", stop()), result(branch(mask=[ord("z")]))),
                 stop())
    code = code.replace('arg=b""', "arg=ARG")
    exec(compile(code, "docs/embedding.md", "exec"), {"CONTROLLER_WASM": scripted_wasm, "ARG": arg})
    out = capsys.readouterr().out
    assert "finished: stop" in out and "'done', b'yes'" in out


def test_writing_controllers_first_example_runs(tmp_path, monkeypatch):
    """docs/writing-controllers.md's `digits.c`, built with the toolchain, run with its snippet."""
    from aicirt import toolchain
    text = (DOCS / "writing-controllers.md").read_text()
    c_code = re.search(r"`digits.c`.*?```c\n(.*?)```", text, re.S).group(1)
    py_code = re.search(r"Run it in pytest.*?```python\n(.*?)```", text, re.S).group(1)
    (tmp_path / "digits.c").write_text(c_code)
    toolchain.build(tmp_path / "digits.c", tmp_path / "digits.wasm", progress=False)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(py_code.replace("print(", "result = ("), "docs/writing-controllers.md", "exec"), scope)
    assert scope["result"] == b"12345"


def test_writing_controllers_zig_example_runs(tmp_path):
    """docs/writing-controllers.md's Zig example builds with aici.zig and prints what it says."""
    from aicirt import toolchain
    from aicirt.engine import Engine
    from aicirt.engine.backends.scripted import ScriptedBackend
    text = (DOCS / "writing-controllers.md").read_text()
    section = text[text.index("## Zig"):]
    zig_code = re.search(r"```zig\n(.*?)```", section, re.S).group(1)
    said = re.search(r"prints `(.*?)`", section).group(1)
    (tmp_path / "hello.zig").write_text(zig_code)
    wasm = toolchain.build_cached(tmp_path / "hello.zig")   # built once per content (SDK and compiler included)
    req = Engine(ScriptedBackend(script="Q: x")).generate("Q: ", controller=str(wasm), chat=False)
    assert req.sequences[0].text_bytes == said.encode() == b" hello from Zig"


def test_json_doc_quotes_what_aicirt_run_prints(tmp_path):
    """docs/json.md's session with a refused schema: the Error line is what the CLI prints today
    and the exit status is 1; its quoted not-JSON log line is the controller's own."""
    from click.testing import CliRunner

    import cli
    text = (DOCS / "json.md").read_text()
    schema, command, quoted = re.search(r"\$ cat bad.json\n(.*?)\n\$ (aicirt run .*?)\n(Error: .*?)\n```",
                                        text, re.S).groups()
    (tmp_path / "bad.json").write_text(schema)
    args = command.split()[1:]
    args[args.index("bad.json")] = str(tmp_path / "bad.json")
    r = CliRunner().invoke(cli.main, args)
    assert r.exit_code == 1 and r.output.strip().splitlines()[-1] == quoted
    not_json = "json: bad schema: not JSON: expected a key at offset 18"
    assert f"`{not_json}`" in text
    (tmp_path / "not.json").write_text('{"type":"object",\n')   # as echo writes it
    r = CliRunner().invoke(cli.main, ["run", "json", "--arg-file", str(tmp_path / "not.json"), "-m", "scripted"])
    assert r.exit_code == 1 and not_json in r.output
