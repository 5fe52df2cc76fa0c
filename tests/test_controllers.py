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
from aicirt.build.toolchain import CONTROLLERS_DIR, build_cached, shipped_controllers

EOS = 256
C = aicirt.Capabilities
# Grants under which each shipped controller must fall back from a splice kind to masks.
NO_FF = C.ALL & ~(C.FF_TOKENS | C.CONDITIONAL_FF_TOKENS)
NO_CONDITIONAL = C.ALL & ~C.CONDITIONAL_FF_TOKENS
CONDITIONAL_ONLY = C.ALL & ~C.FF_TOKENS        # conditional ff-tokens need ff-tokens as well


def grant(caps):
    return (caps.name or "none").lower()


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


@pytest.mark.parametrize("caps", [NO_CONDITIONAL, NO_FF, C.ALL & ~C.BACKTRACK, C.NONE], ids=grant)
def test_splice_rules_under_partial_grants(wasm, caps):
    # without conditional ff-tokens "=>" follows up the step after (ff, or masks); "->" backtracks
    # the step after where it may, else its X is masked out: no 'b' in the output either way
    s = only(run(wasm["splice"], b"a => XYZ\nb -> Q\nmax 10", "aXYZbcdefghij", capabilities=caps))
    assert s.finish_reason == "stop", s.error
    assert s.text_bytes.startswith(b"aXYZ") and b"b" not in s.text_bytes and len(s.text_bytes) == 10
    if caps & C.BACKTRACK and caps & C.FF_TOKENS:
        assert s.text_bytes.startswith(b"aXYZQ")


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


@pytest.mark.parametrize("caps", [NO_FF, NO_CONDITIONAL, CONDITIONAL_ONLY, C.NONE], ids=grant)
@pytest.mark.parametrize("answer", ["Yes", "No"])
def test_yesno_without_ff_tokens_says_the_whole_answer(wasm, caps, answer):
    req = run(wasm["yesno"], b"", answer, capabilities=caps)
    s = only(req)
    assert (s.finish_reason, s.text_bytes) == ("stop", answer.encode()), s.error
    assert req.variables["answer"] == answer.lower().encode()


@pytest.mark.parametrize("caps", [NO_FF, CONDITIONAL_ONLY, C.NONE], ids=grant)
def test_countdown_without_ff_tokens_forces_it_by_masks(wasm, caps):
    # the model wants "x" throughout: only the masks make the countdown
    s = only(run(wasm["countdown"], b"2", "x" * 30, capabilities=caps))
    assert (s.finish_reason, s.text_bytes) == ("stop", b" 2 1 liftoff!"), s.error


@pytest.mark.parametrize("caps", [NO_FF, CONDITIONAL_ONLY], ids=grant)
def test_choice_forks_without_ff_tokens(wasm, caps):
    req = run(wasm["choice"], b"red\ngreen\nblue", "x", capabilities=caps)
    assert all(s.finish_reason == "stop" for s in req.sequences), [s.error for s in req.sequences]
    assert [k.text_bytes for k in req.sequences[1:]] == [b"red", b"green", b"blue"]
    assert req.variables["choices"] == b"red\ngreen\nblue\n"


@pytest.mark.parametrize("caps", [C.ALL & ~C.FORK, C.NONE], ids=grant)
@pytest.mark.parametrize("wanted", ["blue", "green"])
def test_choice_without_fork_picks_one_option_by_masks(wasm, caps, wanted):
    req = run(wasm["choice"], b"red\ngreen\nblue", wanted, capabilities=caps)
    s = only(req)
    assert (s.finish_reason, s.text_bytes) == ("stop", wanted.encode()), s.error
    assert req.variables["choices"] == wanted.encode() + b"\n"


def test_choice_without_fork_ends_a_prefix_option_at_eos(wasm):
    # "ab" is complete while "abc" goes on: EOS is allowed there, and ends the sequence
    req = run(wasm["choice"], b"abc\nab", list(b"ab") + [EOS], capabilities=C.NONE)
    s = only(req)
    assert (s.finish_reason, s.text_bytes) == ("eos", b"ab")
    assert req.variables["choices"] == b"ab\n"


def test_yesno_answers_that_start_alike_are_an_error(wasm):
    s = only(run(wasm["yesno"], b"ab\nac", "x"))     # byte tokens: both start with 'a'
    assert s.finish_reason == "error" and s.text_bytes == b""
    assert any("need distinct first tokens" in line for line in s.logs), s.logs


# --- every shipped controller under the fuzzer, with random capability grants ----------------------
def _in(options):
    return lambda f: f.finish_reason != "stop" or f.text_bytes in options or f"{f.text_bytes!r} not in {options}"


# 30 rules, so that uniform random sampling fires one about one step in eight: "=>" on a-p, "->"
# on q-z and 0-3 (some with nothing to fast-forward)
SPLICE_RULES = "\n".join([f"{c} => {c.upper() * (i % 3)}" for i, c in enumerate("abcdefghijklmnop")]
                         + [f"{c} -> {c.upper() * (i % 2)}" for i, c in enumerate("qrstuvwxyz0123")]
                         + ["max 24"]).encode()
FUZZED = {   # name: (argument, a property of each sequence that ends without error)
    "yesno": (b"", _in({b"Yes", b"No"})),
    "choice": (b"red\ngreen\nblue", _in({b"", b"red", b"green", b"blue"})),   # b"": the parent of a fork
    "countdown": (b"3", _in({b" 3 2 1 liftoff!"})),
    "regex": (b"[a-z]{2,5}", lambda f: f.finish_reason != "stop" or re.fullmatch(rb"[a-z]{2,5}", f.text_bytes)
              is not None),
    "splice": (SPLICE_RULES, None),
    "json": (b'{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}', None),
    "grammar": (b'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/\n',
                lambda f: f.finish_reason != "stop" or re.fullmatch(rb"\([0-9]{1,3}(,[0-9]{1,3})*\)", f.text_bytes)
                is not None),
    # the js controller running the yesno behaviour in JS (its argument: the script, NUL, none)
    "js": ((CONTROLLERS_DIR / "js" / "examples" / "yesno.js").read_bytes() + b"\0", _in({b"Yes", b"No"})),
    "program": (b'{"type": "sequence", "elements": [{"type": "or", "elements": [{"type": "const_string", "value": "a"}, '
                b'{"type": "regex", "pattern": "[0-9]{1,3}", "name": "n"}]}, {"type": "fork", "branches": ['
                b'{"type": "const_string", "value": "!"}, {"type": "any_text", "max_tokens": 3}]}]}', None),
}


def test_every_shipped_controller_is_fuzzed():
    assert set(FUZZED) == set(shipped_controllers())


@pytest.mark.parametrize("name", sorted(FUZZED))
def test_shipped_controller_passes_the_fuzzer_under_random_grants(wasm, name):
    """Random capabilities per run (`capabilities=None`): each controller uses a splice kind only
    where it is granted and falls back to masks, and still says what it should."""
    from aicirt.testing import fuzz

    arg, check = FUZZED[name]
    report = fuzz(wasm[name], arg, steps=600, seed=11, check=check, shrink=False)
    assert report.ok, report
    assert len(report.finish_reasons) and report.runs > 1
