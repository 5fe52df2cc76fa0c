"""Masks equal to llguidance's (forcing off) on every kind of vocabulary, for the json, regex and
program controllers (the grammar controller's own conformance runs in tests/test_grammar.py):
byte-level BPE (Qwen2, GPT-2), SentencePiece with byte fallback (Llama 2: 125 byte strings under
two ids, `<0x41>` and `A`) and a vocabulary where byte strings have two or three ids.

llguidance reads each case as a Lark grammar: a regex as `start: /RE/`, a schema as
`start: %json {SCHEMA}` made compact by `x-guidance` (which our controllers skip, as every x-
keyword); the program controller gets the same regex, schema or grammar as a format. Schemas
have no free-form strings (there the json controller also allows JSON escapes llguidance's
encoder never writes: tests/test_grammar_json.py) and list keys in the order they are written.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
sys.path.insert(0, str(Path(__file__).resolve().parent / "grammars"))

from harness import VOCABS, Llg, Ours, compare  # noqa: E402

from aicirt.build.toolchain import build_cached  # noqa: E402

XG = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}

REGEXES = [
    ("[0-9]{3}-[0-9]{4}", [b"555-1234"], [b"555-12345", b"55-1234"]),
    ("(SELECT|select) [a-z]+( low)?", [b"SELECT x", b"select abc low"], [b"SELECT  x", b"select"]),
    ("title = \"[a-z ]*\"", [b'title = "a b"', b'title = ""'], [b'title = "a\nb"', b"title =\x04"]),
    ("[ -~]+\\+[0-9]+", [b"12+3", b"a b+45"], [b"12+", b"+1"]),
    ("(\u00e9|\u6f22\u5b57)+ ok", ["\u00e9\u6f22\u5b57 ok".encode(), "\u00e9 ok".encode()], [b"\xc3 ok", b"e ok"]),
    # `[^"]` and `.` match whole characters (text mode): no token may start with a byte that
    # cannot begin a UTF-8 character (bench/mask_speed.py's `quoted`: 150,465 tokens allowed at
    # step 1 vs llguidance's 150,272 when they matched single bytes)
    ('[^"]*"', [b'The fox: "', "caf\u00e9 \u6f22\u5b57 \U0001f600\"".encode()],
     [b'\x80"', b'a\xc0\xafb"', b'\xed\xa0\x80"', b'no quote']),
    ("a.{1,3}!", ["a\u00e9\u6f22!".encode(), b"a-!"], [b"a\n!", b"a\xff!", b"a!"]),
]

SCHEMAS = [
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a", "b"],
      "additionalProperties": False},
     [b'{"a":12,"b":true}', b'{"a":-3,"b":false}'], [b'{"a":1.5,"b":true}', b'{"a":1}', b'{"b":true,"a":1}']),
    ({"type": "array", "items": {"enum": ["red", "green", 3, None]}, "maxItems": 3},
     [b'["red",3]', b'[]', b'[null,"green","red"]'], [b'["blue"]', b'[1,2,3,4]']),
    ({"type": "object", "properties": {"op": {"const": "add"}, "args": {"type": "array", "items": {"type": "number"}}},
      "required": ["op", "args"], "additionalProperties": False},
     [b'{"op":"add","args":[1,2.5e3,-0.5]}'], [b'{"op":"sub","args":[]}', b'{"op":"add","args":[01]}']),
]

GRAMMARS = [
    ('start: expr\nexpr: term (("+"|"-") term)*\nterm: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+/\n',
     [b"12+3", b"(1-2)+30"], [b"12+", b"1++2"]),
    ('start: "SELECT " NAME ("," NAME)* " FROM " NAME\nNAME: /[a-z_]+/\n',
     [b"SELECT a,b FROM t"], [b"SELECT  a FROM t", b"SELECT a FROM"]),
]

VOCAB_NAMES = ["qwen2", "gpt2", "llama2", "dup"]


@pytest.fixture(scope="module", params=VOCAB_NAMES)
def vocab(request):
    """(vocabulary, llguidance, the controllers on it: one runtime each, made on first use)."""
    v = VOCABS[request.param]()
    made: dict[str, Ours] = {}

    def ctrl(name: str) -> Ours:
        if name not in made:
            made[name] = Ours(v, options=b"\0fast_forward=0" if name == "json" else b"",
                              wasm=build_cached(name).read_bytes(), no_ff=name == "program")
        return made[name]

    yield v, Llg(v), ctrl
    for o in made.values():
        o.close()


def _lark_regex(pattern: str) -> str:
    return "start: /" + pattern.replace("/", "\\/") + "/\n"


def _json_lark(schema) -> str:
    return "start: %json " + json.dumps({**schema, "x-guidance": XG}) + "\n"


def _check(ours: Ours, llg: Llg, v, arg: str, lark: str, good: list[bytes], bad: list[bytes]):
    h, err, _ = ours.open(arg)
    assert err is None, err
    ours.close_handle(h)
    lm, lerr, _ = llg.compile(lark)
    assert lerr is None, lerr
    r = _compare_with(ours, llg, arg, lark, good + bad, v)
    for i, (text, ours_ok, llg_ok, diff, _) in enumerate(r):
        want = i < len(good)
        assert diff is None, f"{v.name}: {text!r}: masks differ after {diff[1]!r}: {diff[2]}"
        assert ours_ok == want and llg_ok == want, (v.name, text, ours_ok, llg_ok)


def _compare_with(ours, llg, arg, lark, texts, v):
    """harness.compare with our argument and llguidance's grammar text apart."""
    compile_ = llg.compile
    llg.compile = lambda _g: compile_(lark)
    try:
        r = compare(ours, llg, arg, texts, v)
    finally:
        llg.compile = compile_
    assert r["ours_error"] is None and r["llg_error"] is None, r
    return r["results"]


@pytest.mark.parametrize("case", range(len(REGEXES)))
def test_regex_controller(vocab, case):
    pattern, good, bad = REGEXES[case]
    v, llg, ctrl = vocab
    _check(ctrl("regex"), llg, v, pattern, _lark_regex(pattern), good, bad)


@pytest.mark.parametrize("case", range(len(SCHEMAS)))
def test_json_controller(vocab, case):
    schema, good, bad = SCHEMAS[case]
    v, llg, ctrl = vocab
    _check(ctrl("json"), llg, v, json.dumps(schema), _json_lark(schema), good, bad)


def _program_cases():
    out = [("regex", {"type": "regex", "pattern": p}, _lark_regex(p), g, b) for p, g, b in REGEXES[:3] + REGEXES[5:6]]
    out += [("json", {"type": "json_schema", "json_schema": s}, _json_lark(s), g, b) for s, g, b in SCHEMAS]
    out += [("grammar", {"type": "grammar", "grammar": gr}, gr, g, b) for gr, g, b in GRAMMARS]
    return out


PROGRAM_CASES = _program_cases()


@pytest.mark.parametrize("case", range(len(PROGRAM_CASES)))
def test_program_controller(vocab, case):
    _, fmt, lark, good, bad = PROGRAM_CASES[case]
    v, llg, ctrl = vocab
    _check(ctrl("program"), llg, v, json.dumps(fmt), lark, good, bad)
