"""The docs are true: their code runs (docs/embedding.md's step loop, the controller examples),
docs/protocol.md quotes wit/aici.wit exactly and every link to one of its sections resolves, and
every figure's raw file exists (each README benchmark row links one)."""
from __future__ import annotations

import re
from pathlib import Path

from scripted import branch, by_fork_index, result, script, splice, stop, var_set


ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


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
    from aicirt.build import toolchain
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
    from aicirt.build import toolchain
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


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_protocol_quotes_the_wit_exactly():
    """docs/protocol.md is normative for the WIT by quoting it: the block must be the file."""
    text = (DOCS / "protocol.md").read_text()
    block = re.search(r'<a id="wit"></a>.*?```wit\n(.*?)```', text, re.S).group(1)
    assert block == (ROOT / "wit" / "aici.wit").read_text()


def test_every_link_to_a_protocol_section_resolves():
    """Every link to docs/protocol.md with a section anchor (code, tests, docs) names an anchor the page has."""
    anchors = set(re.findall(r'<a id="([\w-]+)"></a>', (DOCS / "protocol.md").read_text()))
    assert {"wit", "binary", "semantics", "limits", "hosts"} <= anchors
    bad = []
    for folder in ("runtime", "controllers", "tests", "bench", "docs", "tools"):
        for p in (ROOT / folder).rglob("*"):
            if p.suffix not in {".py", ".c", ".h", ".md", ".zig", ".js", ".ts"} or "data" in p.parts:
                continue
            for a in re.findall(r"protocol\.md((?:#[\w-]+)(?:(?:, |/)#[\w-]+)*)", p.read_text(errors="replace")):
                bad += [f"{p.relative_to(ROOT)}: #{x}" for x in re.findall(r"#([\w-]+)", a) if x not in anchors]
    assert bad == []


def test_every_linked_raw_file_exists():
    """A figure's raw output, named in README or docs/, is committed (bench/results/)."""
    missing = []
    for doc in _doc_files():
        for name in re.findall(r"bench/results/([\w.-]+\.txt)", doc.read_text()):
            if not (ROOT / "bench" / "results" / name).is_file():
                missing.append(f"{doc.relative_to(ROOT)}: bench/results/{name}")
    assert missing == []


def test_every_readme_benchmark_row_links_its_raw_output():
    """Each row of the README's benchmark table links at least one raw file it was read from."""
    text = (ROOT / "README.md").read_text()
    table = re.search(r"\| benchmark \| what it compares.*?\n\n", text, re.S).group(0)
    rows = [r for r in table.splitlines()[2:] if r.startswith("| `bench/")]
    assert len(rows) >= 5
    unlinked = [r.split("|")[1].strip() for r in rows if not re.search(r"\]\(bench/results/[\w.-]+\.txt\)", r)]
    assert unlinked == []


def test_no_reference_to_the_old_spec_is_left():
    """The contract is docs/protocol.md; "SPEC §N" pointed at a file outside the repository.
    `python tools/spec_refs.py` rewrites any that a merge brings back."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("spec_refs", ROOT / "tools" / "spec_refs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.leftovers() == []
    assert mod.rewrite("runtime/x.py", "(SPEC §2, §4)") == "(docs/protocol.md#wit, #limits)"
    assert mod.rewrite("docs/x.md", "SPEC §3 says") == "[protocol §3](protocol.md#semantics) says"
