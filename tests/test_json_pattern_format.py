"""String keywords together (controllers/lib/json/schema_string.c): `format` beside `pattern` (exact: the
inner language where one lies inside the other, else their product automaton), `enum` / `const`
beside pattern, format and length bounds (each literal decided exactly, its length in code
points: an astral character, a surrogate pair in the schema's text, is one). Every verdict is
checked against `jsonschema` (with its format checker)."""
from __future__ import annotations

import json

import pytest

from test_json_schema import assert_verdicts_agree, session, walk

E = "\U0001F600"   # one code point; "\ud83d\ude00" in the schema's JSON text


CASES = [
    # format beside pattern: the pattern inside the format
    ({"type": "string", "format": "email", "pattern": "^[a-z]+@[a-z]+\\.com$"}, [('"ab@cd.com"', True), ('"ab@cd.org"', False)]),
    ({"type": "string", "format": "date", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"}, [('"2024-01-31"', True), ('"2024-13-01"', False)]),
    # neither inside the other: both (the public schemas' shape: a prefix beside `uri`)
    ({"type": "string", "format": "uri", "pattern": "^(https|file)://"},
     [('"https://a.b/c"', True), ('"file:///x"', True), ('"http://a.b"', False)]),
    ({"type": "string", "format": "uri", "pattern": "^mailto:"}, [('"mailto:a@b.c"', True), ('"mail:a"', False)]),
    ({"type": "string", "format": "date", "pattern": "^2"}, [('"2024-01-31"', True), ('"1999-01-01"', False), ('"2x"', False)]),
    # enum beside pattern + length: exact per literal (this used to drop valid literals)
    ({"enum": [E + "a", "xx", E + E + "a"], "maxLength": 2, "pattern": "a"},
     [(json.dumps(E + "a", ensure_ascii=False), True), (json.dumps(E + E + "a", ensure_ascii=False), False), ('"xx"', False)]),
    ({"enum": ["abcdefghijklmnopqrstuvwxyz0123456789", "ab"], "pattern": "^[a-z0-9]+$", "maxLength": 40},
     [('"abcdefghijklmnopqrstuvwxyz0123456789"', True), ('"ab"', True)]),
    ({"enum": ["ab@cd.com", "nope", 3], "format": "email", "pattern": "^[a-z]+@"},
     [('"ab@cd.com"', True), ('"nope"', False), ("3", True)]),
    ({"type": "string", "enum": ["x", "yy", "zzz"], "minLength": 2}, [('"x"', False), ('"yy"', True), ('"zzz"', True)]),
    # an astral character is one character for minLength / maxLength
    ({"type": "string", "maxLength": 1}, [(json.dumps(E, ensure_ascii=False), True)]),
    ({"type": "string", "minLength": 2, "maxLength": 2}, [(json.dumps(E, ensure_ascii=False), False),
                                                          (json.dumps(E + E, ensure_ascii=False), True)]),
    ({"const": E, "minLength": 1, "maxLength": 1, "pattern": "^.+$"}, [(json.dumps(E, ensure_ascii=False), True)]),
]


@pytest.mark.parametrize("schema, docs", CASES, ids=[json.dumps(s)[:60] for s, _ in CASES])
def test_verdicts_agree_with_jsonschema(schema, docs):
    assert_verdicts_agree(schema, docs)


def test_a_uri_with_a_space_is_refused_beside_a_prefix_pattern():
    """(jsonschema checks `uri` only with rfc3987 installed: not asserted against it)"""
    assert walk({"type": "string", "format": "uri", "pattern": "^(https|file)://"}, '"https://a b"')[0] == "rejected"


def test_surrogate_pair_in_the_schema_text_is_one_character():
    text = b'{"type": "string", "enum": ["\\ud83d\\ude00"], "maxLength": 1}'
    h, br = session(text)
    assert br, h.logs
    got, _ = walk(text, json.dumps(E, ensure_ascii=False))
    assert got == "accepted"


@pytest.mark.parametrize("schema, message", [
    ({"type": "string", "format": "date", "pattern": "^2", "maxLength": 12},
     "unsupported: maxLength at # (beside both a pattern and a format"),
])
def test_what_stays_refused_says_why(schema, message):
    h, br = session(schema)
    assert br == [] and any(line.startswith("json: " + message) for line in h.logs), h.logs
