"""`aicirt build`: sources -> checked controller modules; diagnostics; the component claim."""
from __future__ import annotations

import re

import subprocess
import sys

import pytest
import wasmtime
from click.testing import CliRunner

import _require as require

from aicirt.build import toolchain
from aicirt.build.toolchain import BuildError, build, build_cached, check_module, shipped_controllers

CONTROLLERS, WIT = toolchain.CONTROLLERS_DIR, toolchain.WIT_DIR
MINIMAL = '#include "aici.h"\nvoid aici_step(const aici_arg_t *arg, aici_result_t *res) { aici_noop(res); }\n'


def exports(path):
    m = wasmtime.Module(wasmtime.Engine(), path.read_bytes())
    return {e.name for e in m.exports}, {(i.module, i.name) for i in m.imports}


def test_build_c_file(tmp_path):
    src = tmp_path / "mini.c"
    src.write_text(MINIMAL)
    r = build(src, tmp_path / "out" / "mini.wasm", progress=False)
    assert r.path.exists() and r.size == r.path.stat().st_size and r.seconds > 0
    ex, im = exports(r.path)
    assert {"memory", "cabi_realloc", "mid-process", "cabi_post_mid-process", "_initialize"} <= ex
    assert all(mod == "aici:controller/host@0.1.0" for mod, _ in im)   # libc-free: no WASI


def test_build_shipped_by_name_and_default_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = build("yesno", progress=False)
    assert r.path == tmp_path / "yesno.wasm" and r.size > 1000


def test_build_zig_folder(tmp_path):
    r = build(CONTROLLERS / "countdown", tmp_path / "c.wasm", progress=False)
    assert "mid-process" in exports(r.path)[0]


ZIG_INIT = """const aici = @import("aici");
var ran_init: bool = false;
export fn aicirt_init() void { ran_init = aici.aici_trie() != null; }
export fn aici_step(arg: *const aici.Arg, res: *aici.Result) void {
    if (arg.call_index > 0) return;
    const toks = aici.tokenize(if (ran_init) "init ran" else "no init");
    defer aici.free(toks);
    aici.ff(res, 0, toks);
}
"""


def test_zig_init_is_exported_and_run(tmp_path):
    """A Zig `export fn aicirt_init` is exported (Zig exports a symbol only when the linker is
    told) and the runtime runs it at load; a Zig source without one still links."""
    from aicirt.engine import Engine
    from aicirt.engine.backends.scripted import ScriptedBackend
    (tmp_path / "init.zig").write_text(ZIG_INIT)
    r = build(tmp_path / "init.zig", tmp_path / "init.wasm", progress=False)
    assert "aicirt_init" in exports(r.path)[0]
    req = Engine(ScriptedBackend(script="Q: x")).generate("Q: ", controller=str(r.path), chat=False)
    assert req.sequences[0].text_bytes == b"init ran"
    plain = build(CONTROLLERS / "countdown", tmp_path / "c.wasm", progress=False)
    assert "aicirt_init" not in exports(plain.path)[0]


def test_compiler_diagnostics_have_file_and_line(tmp_path):
    src = tmp_path / "broken.c"
    src.write_text(MINIMAL + "int f(void) { return undefined_thing; }\n")
    with pytest.raises(BuildError) as e:
        build(src, tmp_path / "b.wasm", progress=False)
    assert "broken.c:3:" in e.value.message and "undefined_thing" in e.value.message
    assert not (tmp_path / "b.wasm").exists()


def test_zig_diagnostics_have_file_and_line(tmp_path):
    src = tmp_path / "bad.zig"
    src.write_text('const aici = @import("aici");\nexport fn aici_step() void {\n    nope();\n}\n')
    with pytest.raises(BuildError) as e:
        build(src, tmp_path / "z.wasm", progress=False)
    assert "bad.zig:3:" in e.value.message


def test_missing_aici_step_is_explained(tmp_path):
    src = tmp_path / "empty.c"
    src.write_text('#include "aici.h"\n')
    with pytest.raises(BuildError) as e:
        build(src, tmp_path / "e.wasm", progress=False)
    assert "aici_step" in e.value.message and "hint" in e.value.message


@pytest.mark.parametrize("wat, needle", [
    ('(module (memory (export "memory") 1)'
     ' (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const 0))', "mid-process"),
    ('(module (memory (export "memory") 1)'
     ' (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const 0)'
     ' (func (export "mid-process") (param i32) (result i32) i32.const 0))', "mid-process"),
])
def test_contract_violations_are_named(wat, needle):
    with pytest.raises(BuildError) as e:
        check_module(wasmtime.wat2wasm(wat), "x.wasm")
    assert needle in e.value.message


def test_unknown_source(tmp_path):
    with pytest.raises(BuildError, match="no such file"):
        build(tmp_path / "nothing.c", progress=False)
    with pytest.raises(BuildError, match="shipped controllers"):
        build("no_such_controller", progress=False)


def test_progress_is_shown_for_slow_compiles(capsys):
    r = toolchain._run([sys.executable, "-c", "import time; time.sleep(1.5)"], "slow.c", True)
    assert r.returncode == 0
    assert "compiling slow.c" in capsys.readouterr().err


def test_cli_build_prints_size_and_time(tmp_path):
    from cli import main
    out = tmp_path / "r.wasm"
    res = CliRunner().invoke(main, ["build", "regex", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert str(out) in res.output and "bytes in" in res.output and out.exists()
    bad = tmp_path / "bad.c"
    bad.write_text("int x = ;\n")
    res = CliRunner().invoke(main, ["build", str(bad)])
    assert res.exit_code != 0 and "bad.c:1:" in res.output


def test_build_cache_reuses_output(tmp_path):
    a = build_cached("yesno", tmp_path)
    mtime = a.stat().st_mtime_ns
    assert build_cached("yesno", tmp_path) == a and a.stat().st_mtime_ns == mtime



def test_build_cache_key_covers_headers_beside_the_source(tmp_path):
    src = tmp_path / "ctl"
    src.mkdir()
    (src / "answer.h").write_text("#define ANSWER 65\n")
    (src / "main.c").write_text(
        '#include "aici.h"\n#include "answer.h"\n'
        "void aici_step(const aici_arg_t *arg, aici_result_t *res) {\n"
        "    aici_tokset_t *m = aici_tokset_tmp();\n"
        "    aici_tokset_allow_range(m, ANSWER, ANSWER + 1);\n"
        "    aici_sample(res, m);\n}\n")
    first = build_cached(src, tmp_path / "cache")
    (src / "answer.h").write_text("#define ANSWER 66\n")
    second = build_cached(src, tmp_path / "cache")
    assert second != first and second.read_bytes() != first.read_bytes()


@require.tool("wasm-tools")
@pytest.mark.parametrize("name", shipped_controllers())
def test_shipped_controllers_are_components(name, tmp_path):
    """The binary-form claim: wit-component accepts every shipped controller as world `controller`.
    A libc-built one (js) also imports WASI preview 1 (docs/wasi.md), which a component gets from
    an adapter module this project does not ship: for it, `component new` must fail on nothing
    but that interface."""
    wasm = build_cached(name)
    wasi = any(imp.module == "wasi_snapshot_preview1" for imp in wasmtime.Module.from_file(wasmtime.Engine(), str(wasm)).imports)
    emb, comp = tmp_path / "e.wasm", tmp_path / "c.wasm"
    for cmd in (["wasm-tools", "component", "embed", str(WIT), "--world", "controller", str(wasm), "-o", str(emb)],
                ["wasm-tools", "component", "new", str(emb), "-o", str(comp)]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if wasi and cmd[2] == "new":
            assert r.returncode != 0 and "module requires an import interface named `wasi_snapshot_preview1`" in r.stderr, r.stderr
            continue
        assert r.returncode == 0, r.stderr


# -- controller libraries (controllers/lib, named by a recipe's "libs") -----------------------------

def _lib_tree(tmp_path, monkeypatch):
    from aicirt.build import recipe
    lib = tmp_path / "lib"
    (lib / "a").mkdir(parents=True)
    (lib / "b").mkdir()
    (lib / "a" / "a.c").write_text('#include "a.h"\nint a_value(void) { return A; }\n')
    (lib / "a" / "a.h").write_text("#define A 7\nint a_value(void);\n")
    (lib / "b" / "b.c").write_text('#include "a.h"\nint b_value(void) { return a_value() + 1; }\n')
    (lib / "b" / "lib.json").write_text('{"libs": ["a"]}')
    monkeypatch.setattr(recipe, "_lib_dir", lambda: lib)
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "main.c").write_text('#include "aici.h"\nint b_value(void);\n'
                                "void aici_step(const aici_arg_t *arg, aici_result_t *res) {\n"
                                "  if (b_value() != 8) __builtin_trap();   /* no branch: stop */\n}\n")
    (ctl / "build.json").write_text('{"libs": ["b"]}')
    return lib, ctl


def test_a_recipe_links_its_libraries_and_theirs(tmp_path, monkeypatch):
    from aicirt.build import recipe
    lib, ctl = _lib_tree(tmp_path, monkeypatch)
    assert recipe.libs(recipe.find(ctl)) == [lib / "a", lib / "b"]     # a library after those it needs
    r = build(ctl, tmp_path / "ctl.wasm", progress=False)
    check_module(r.path.read_bytes(), "ctl.wasm")


def test_the_build_cache_key_covers_a_library_file(tmp_path, monkeypatch):
    from aicirt.build.toolchain import source_hash
    lib, ctl = _lib_tree(tmp_path, monkeypatch)
    before = source_hash(ctl)
    (lib / "a" / "a.h").write_text("#define A 8\nint a_value(void);\n")   # a header of a library two steps away
    assert source_hash(ctl) != before


def test_a_recipe_naming_no_such_library_or_a_circle_is_refused(tmp_path, monkeypatch):
    from aicirt.build import recipe
    lib, ctl = _lib_tree(tmp_path, monkeypatch)
    (ctl / "build.json").write_text('{"libs": ["nope"]}')
    with pytest.raises(BuildError, match="no controller library 'nope'"):
        recipe.find(ctl)
    (ctl / "build.json").write_text('{"libs": ["b"]}')
    (lib / "a" / "lib.json").write_text('{"libs": ["b"]}')
    with pytest.raises(BuildError, match="circle: b -> a -> b"):
        recipe.libs(recipe.find(ctl))


def test_shipped_controllers_share_code_through_libraries_not_shims():
    from aicirt.build.toolchain import CONTROLLERS_DIR
    assert "lib" not in shipped_controllers() and "sdk" not in shipped_controllers()
    shims = [p for p in CONTROLLERS_DIR.rglob("*.c") if re.search(r'#include "\.\./[^"]+\.c"', p.read_text())]
    assert shims == []
