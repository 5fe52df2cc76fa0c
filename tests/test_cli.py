"""`aicirt check`: accepts a controller, names what is wrong with anything else; `aicirt run`'s
one-line errors."""
from __future__ import annotations

import sys

from click.testing import CliRunner

from cli import main


def test_check_accepts_a_controller(scripted_wasm):
    r = CliRunner().invoke(main, ["check", str(scripted_wasm)])
    assert r.exit_code == 0, r.output
    assert "a controller" in r.output and "var-append" in r.output and "post-return: yes" in r.output


def test_check_names_the_problem(tmp_path):
    bad = tmp_path / "bad.wasm"
    bad.write_bytes(b"\0asm\x01\0\0\0")       # a valid, empty module
    r = CliRunner().invoke(main, ["check", str(bad)])
    assert r.exit_code == 1
    assert "missing export `memory`" in r.output and "missing export `mid-process`" in r.output


def test_run_without_an_optional_extra_says_what_to_install_in_one_line(scripted_wasm, monkeypatch):
    from aicirt.build import toolchain
    toolchain.build_cached("yesno")   # built first: a compile taking over 1 s (a busy machine) prints a progress line
    monkeypatch.setitem(sys.modules, "llama_cpp", None)    # as if llama-cpp-python were not installed
    r = CliRunner().invoke(main, ["run", "yesno", "--model", "llamacpp:model.gguf"])
    assert r.exit_code == 1
    assert r.output.count("\n") == 1 and "pip install 'aicirt[llamacpp]'" in r.output, r.output
    assert "Traceback" not in r.output


def test_run_exits_non_zero_with_one_line_when_a_sequence_fails():
    r = CliRunner().invoke(main, ["run", "regex", "--arg", "(", "--model", "scripted", "--prompt", "x"])
    assert r.exit_code == 1, r.output
    last = r.output.strip().splitlines()[-1]
    # rejected on its first call, over the byte tokenizer, before the (scripted) model loads
    # the controller's own reason first (aicirt.errors.failure_message), then where and the Wasm detail
    assert last.startswith("Error: regex: missing ) at offset 1"), last
    # (the regex compiles in its aicirt_prepare: the stage is named)
    assert "(the controller failed on its first call, before the model loaded: aicirt_prepare: trap: " in last


def test_run_exits_zero_when_every_sequence_ends_well():
    r = CliRunner().invoke(main, ["run", "regex", "--arg", "[0-9]{2}", "--model", "scripted", "--prompt", "x"])
    assert r.exit_code == 0, r.output
    assert "#0: stop (2 tokens)" in r.output
