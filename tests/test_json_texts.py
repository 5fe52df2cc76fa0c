"""The schema compiler's shorter regex texts keep the languages they stand for: \\M for every
character from U+0080 on, the control characters' escapes as one piece, a key trie's divergences
as runs. Each document is checked against `jsonschema` (the compact, UTF-8 form the controller
writes; escapes where JSON needs them), accepted iff valid.
"""
from __future__ import annotations

import json

import pytest

from test_json_defects import ck  # noqa: F401  (the fixture: a Checker over a byte vocabulary)

jsonschema = pytest.importorskip("jsonschema")


INT = {"type": "integer"}
# listed keys with uppercase letters, digits and punctuation below the backslash (their trie
# nodes' divergences leave the control characters beside other escapes), a NUL and a non-ASCII one
KEYS = {"aB1": INT, "x-Y": INT, "\u0000k": INT, "é9": INT, "A": INT}
KEY_DOCS = ["aB1", "aB2", "aB", "a", "x-Y", "x-Z", "x", "\u0000k", "\u0000", "\u0001k", "k", "é9", "é", "éa", "漢",
            "A", "AB", "B", "\u001f", "a\u001fb", "a\nb", "a\"b", "a\\b", "a/b", "\u007f", "\u0080", "\U0001F600x"]


def docs_for(keys):
    out = []
    for k in keys:
        for v in (1, "s"):
            out.append(json.dumps({k: v}, ensure_ascii=False, separators=(",", ":")))
    return out


@pytest.mark.parametrize("extra", [None, False, INT, {"type": "string", "maxLength": 3}],
                         ids=["open", "closed", "int", "short-string"])
def test_key_divergences_and_escapes(ck, extra):
    schema = {"type": "object", "properties": KEYS}
    if extra is not None:
        schema["additionalProperties"] = extra
    h, err, _ = ck.open(schema)
    try:
        assert err is None, err
        for doc in docs_for(KEY_DOCS):
            want = jsonschema.Draft202012Validator(schema).is_valid(json.loads(doc))
            assert ck.accepts(h, doc.encode())[0] == want, (schema, doc)
    finally:
        ck.close_handle(h)


STRINGS = ["", "a", "é", "漢字", "\U0001F600", "a\u0000b", "\u001f", "\n\t", "\"", "\\", "/", "\u007f", "\u0080",
           "\ud7ff", "\ue000", "\U0010ffff"]


@pytest.mark.parametrize("schema", [
    {"type": "string"},
    {"type": "string", "maxLength": 2},
    {"type": "string", "pattern": "^[^a]*$"},
    {"type": "string", "pattern": "^[\u0000-\u001f\u0080-\U0010ffff]*$"},
    {"type": "object", "additionalProperties": {"type": "string"}},
], ids=["free", "maxLength", "not-a", "controls-and-wide", "values"])
def test_string_characters(ck, schema):
    h, err, _ = ck.open(schema)
    try:
        assert err is None, err
        for s in STRINGS:
            value = {s: s} if schema["type"] == "object" else s
            doc = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            want = jsonschema.Draft202012Validator(schema).is_valid(value)
            assert ck.accepts(h, doc.encode())[0] == want, (schema, doc)
    finally:
        ck.close_handle(h)
