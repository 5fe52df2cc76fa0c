"""Inline `%json {SCHEMA}` in grammars (controllers/lib/grammar/json_term.c): one lexeme whose
language is the json controller's documents for SCHEMA (compact, keys in schema order).

llguidance reads the same grammar text; its JSON is made compact by the schema's `x-guidance`
settings (which the json controller skips, as every x- keyword). Masks are compared at every
prefix: bit for bit where the schema has no free-form string; inside free strings the json
controller also allows what JSON allows and llguidance's encoder never writes (a raw DEL, the
escapes `\\/` and `\\uXXXX`), so there ours may only add tokens holding one of those.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import llguidance  # noqa: E402,F401  (the dev extra: a missing one fails, never skips)
sys.path.insert(0, str(Path(__file__).resolve().parent / "grammars"))

from harness import VOCABS, Llg, Ours, allowed, as_mask, compare  # noqa: E402

XG = '"x-guidance": {"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}'

#: (grammar, accepted strings, rejected strings): schemas without free strings
EXACT = [
    ('start: "x" %json {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], '
     '"additionalProperties": false, ' + XG + '} "y"\n',
     [b'x{"a":1}y', b'x{"a":-12}y'], [b'x{"a":1.5}y', b'x{"a":1}', b'x{}y', b'x{"a": 1}y']),
    ('start: item ("," item)*\nitem: %json {"type": "integer", ' + XG + '} | NAME\nNAME: /[a-z]+/\n',
     [b'1,2,abc', b'12,ab,-3'], [b'1,,2', b'01', b'a1']),
    ('start: "<tool>" call "</tool>"\ncall: %json {"type": "object", "properties": {"op": {"enum": ["add", "sub"]}, '
     '"args": {"type": "array", "items": {"type": "number"}, "maxItems": 3}, "dry": {"type": "boolean"}}, '
     '"required": ["op", "args"], "additionalProperties": false, ' + XG + '}\n',
     [b'<tool>{"op":"add","args":[1,2.5]}</tool>', b'<tool>{"op":"sub","args":[],"dry":true}</tool>'],
     [b'<tool>{"op":"mul","args":[]}</tool>', b'<tool>{"args":[],"op":"add"}</tool>', b'<tool>{"op":"add","args":[1,2,3,4]}</tool>']),
]

FREE = [
    ('start: %json {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], '
     '"additionalProperties": false, ' + XG + '} /\\n*/\n',
     [b'{"name":"bob"}\n', b'{"name":"a\\"b"}'], [b'{"name":bob}', b'{"name":"x"']),
    ('start: %json {"type": "boolean", ' + XG + '} ";" %json {"type": "string", "maxLength": 3, ' + XG + '}\n',
     [b'true;"abc"', b'true;""'], [b'false;"abcd"', b'tru;"a"']),
]


@pytest.fixture(scope="module", params=["bytes", "qwen2", "llama2", "dup"])
def pair(request):
    v = VOCABS[request.param]()
    ours = Ours(v)
    yield ours, Llg(v), v
    ours.close()


def run(pair, grammar, good, bad):
    ours, llg, v = pair
    r = compare(ours, llg, grammar, good + bad, v)
    assert r["ours_error"] is None and r["llg_error"] is None, r
    for i, (text, ours_ok, llg_ok, diff, _) in enumerate(r["results"]):
        want = i < len(good)
        assert ours_ok == want and llg_ok == want, (text, ours_ok, llg_ok)
        yield text, diff


@pytest.mark.parametrize("case", range(len(EXACT)))
def test_json_lexeme_masks_equal_llguidance(pair, case):
    for text, diff in run(pair, *EXACT[case]):
        assert diff is None, f"{text!r}: masks differ after {diff[1]!r}: {diff[2]}"


def json_only_difference(b: bytes) -> bool:
    """Text the json controller allows in a string and llguidance does not."""
    return b"\x7f" in b or b"\\/" in b or b"\\u" in b


@pytest.mark.parametrize("case", range(len(FREE)))
def test_json_lexeme_free_strings_differ_only_by_json_escapes(pair, case):
    ours, llg, v = pair
    grammar, good, bad = FREE[case]
    list(run(pair, grammar, good, bad))                # verdicts agree
    h, err, _ = ours.open(grammar)
    lm, lerr, _ = llg.compile(grammar)
    assert err is None and lerr is None
    try:
        for text in good:
            toks = v.tokenize(text)
            for k, (a, b) in enumerate(zip(ours.masks(h, toks), llg.masks(lm, toks))):
                x, y = as_mask(a, v), as_mask(b, v)
                last = b"".join(v.token_bytes[t] for t in toks[:k])[-1:]   # a backslash before the token
                bits = np.unpackbits((x ^ y).view(np.uint8), bitorder="little")
                for t in np.nonzero(bits)[0]:
                    extra = last + v.token_bytes[int(t)]
                    assert allowed(x, int(t)) and json_only_difference(extra), (text, k, extra)
    finally:
        ours.close_handle(h)
