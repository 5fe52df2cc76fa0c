"""`aicirt check`: accepts a controller, names what is wrong with anything else."""
from __future__ import annotations

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
