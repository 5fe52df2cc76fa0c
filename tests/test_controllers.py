"""Every shipped controller, built with `aicirt build`, run under the engine's scripted backend.

The scripted model prefers `script[len(tokens)]`, so a script that spells prompt + intended
output drives greedy decoding exactly (splices shift positions the same way in both).
"""
from __future__ import annotations

import re

import pytest
import regex

import aicirt
from aicirt.engine.backends.scripted import ScriptedBackend
from aicirt.engine import Engine
from aicirt.toolchain import build_cached, shipped_controllers

EOS = 256


@pytest.fixture(scope="session")
def wasm():
    """name -> path of the built controller (built once per source hash, cached across runs)."""
    return {name: str(build_cached(name)) for name in shipped_controllers()}


def run(wasm_path, arg, script, prompt="Q: ", **kw):
    toks = list(prompt.encode()) + (list(script.encode()) if isinstance(script, str) else list(script))
    eng = Engine(ScriptedBackend(script=toks + [0] * 64))
    try:
        return eng.generate(prompt, controller=wasm_path, arg=arg, chat=False, **kw)
    finally:
        eng.close()


def only(req):
    assert len(req.sequences) == 1, [(s.finish_reason, s.error) for s in req.sequences]
    return req.sequences[0]


def test_every_shipped_controller_exists(wasm):
    assert {"yesno", "choice", "regex", "splice", "countdown"} <= set(wasm)


@pytest.mark.parametrize("answer", ["Yes", "No"])
def test_yesno(wasm, answer):
    req = run(wasm["yesno"], b"", answer)
    s = only(req)
    assert (s.finish_reason, s.text_bytes) == ("stop", answer.encode())
    assert req.variables["answer"] == answer.lower().encode()


def test_yesno_custom_answers_and_mask(wasm):
    # the model wants "M", which is not an option: the mask leaves only the two first tokens
    req = run(wasm["yesno"], b"left\nright", "M")
    assert only(req).text_bytes in (b"left", b"right")


def test_regex_stops_at_eos_when_accepting(wasm):
    s = only(run(wasm["regex"], rb"\d{3}-[a-z]+", list(b"123-abc") + [EOS]))
    assert (s.finish_reason, s.text_bytes) == ("eos", b"123-abc")


def test_regex_stops_when_nothing_can_follow(wasm):
    s = only(run(wasm["regex"], rb"\d{3}", "12345"))
    assert (s.finish_reason, s.text_bytes) == ("stop", b"123")


@pytest.mark.parametrize("pattern", [rb"[0-9]+", rb"(ab|cd)+x", rb"[^\"]*\"", rb"\w+@\w+\.com"])
def test_regex_output_always_matches(wasm, pattern):
    # the script wants text that does not match: the mask must win every step
    s = only(run(wasm["regex"], pattern, "hello, world 42 and more text!!"))
    assert s.finish_reason in ("eos", "stop", "length"), s.error
    if s.finish_reason == "length":   # cut short: still a prefix of a match
        assert regex.fullmatch(pattern, s.text_bytes, partial=True), s.text_bytes
    else:
        assert re.fullmatch(pattern, s.text_bytes), s.text_bytes


def test_regex_bad_pattern_is_an_error(wasm):
    s = only(run(wasm["regex"], b"(ab", "ab"))
    assert s.finish_reason == "error" and s.text_bytes == b""
    assert any("missing ) at offset 3 in pattern '(ab'" in line for line in s.logs), s.logs


def test_splice_conditional_ff_and_backtrack(wasm):
    # 'a' is kept and followed by "XYZ"; 'b' is taken back (backtrack 1) and replaced by "Q"
    s = only(run(wasm["splice"], b"a => XYZ\nb -> Q\nmax 10", "aXYZbcdefghij"))
    assert s.finish_reason == "stop"
    assert s.text_bytes.startswith(b"aXYZQ") and b"b" not in s.text_bytes
    assert len(s.text_bytes) == 10


def test_countdown_rejects_a_non_number(wasm):
    s = only(run(wasm["countdown"], b"four", "x"))
    assert s.finish_reason == "error" and s.text_bytes == b""
    assert any("the argument must be a number" in line for line in s.logs), s.logs


def test_countdown_zig(wasm):
    s = only(run(wasm["countdown"], b"4", "x"))
    assert (s.finish_reason, s.text_bytes) == ("stop", b" 4 3 2 1 liftoff!")


def test_choice_forks_and_joins(wasm):
    req = run(wasm["choice"], b"red\ngreen\nblue", "x")
    parent, *kids = req.sequences
    assert [k.text_bytes for k in kids] == [b"red", b"green", b"blue"]
    assert all(s.finish_reason == "stop" for s in req.sequences), [s.error for s in req.sequences]
    assert parent.text_bytes == b""
    v = req.variables
    assert [v[f"choice.{i}"] for i in range(3)] == [b"red", b"green", b"blue"]
    assert v["choices"] == b"red\ngreen\nblue\n"


def test_choice_without_fork_capability(wasm):
    caps = aicirt.Capabilities.ALL & ~aicirt.Capabilities.FORK
    s = only(run(wasm["choice"], b"a\nb", "x", capabilities=caps))
    assert s.finish_reason == "error"
    assert any("does not grant fork" in line for line in s.logs)


def test_yesno_answers_that_start_alike_are_an_error(wasm):
    s = only(run(wasm["yesno"], b"ab\nac", "x"))     # byte tokens: both start with 'a'
    assert s.finish_reason == "error" and s.text_bytes == b""
    assert any("need distinct first tokens" in line for line in s.logs), s.logs
