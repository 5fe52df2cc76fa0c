"""Exact `oneOf` and `not` in the json controller (controllers/lib/json/schema_not.c, "complements"):
a branch's complement written as a union of schemas the compiler enforces, so that "exactly one
branch" is an anyOf of branch-and-not-the-others; schemas that admit no document are refused
(controllers/lib/json/empty.c). Every verdict is checked against `jsonschema`, and documents sampled
under the masks (random choices over bytes) must validate."""
from __future__ import annotations

import json
import random

import pytest

from test_json_schema import assert_verdicts_agree, BYTES, EOS, session, valid_by_jsonschema, walk

SHAPES = {  # the shape of Glaive's calculate_area_4c8e9fd1: the branches constrain keys the object does not list
    "type": "object",
    "properties": {"radius": {"type": "number"}, "length": {"type": "number"}},
    "oneOf": [
        {"properties": {"shape": {"const": "circle"}, "length": {"not": {}}}},
        {"properties": {"shape": {"const": "square"}, "radius": {"not": {}}}},
    ],
}
KEYS = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
# (schema, [(document, valid?)]): documents list keys in schema order (the matcher's order)
CASES = [
    (KEYS, [("{}", False), ('{"a":1}', True), ('{"b":2}', True), ('{"a":1,"b":2}', False), ("1", False)]),
    ({"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, [("1", False), ('{"a":1}', True), ('{"a":1,"b":2}', False)]),
    (SHAPES, [("{}", False), ('{"radius":1}', True), ('{"radius":1,"length":1}', False), ('{"radius":1,"shape":"circle"}', True),
              ('{"length":1,"shape":"square"}', True), ('{"radius":1,"shape":"square"}', False),
              ('{"shape":"triangle"}', False), ('{"shape":"circle"}', True)]),
    ({"oneOf": [{"type": "string"}, {"minLength": 1}]}, [('""', True), ('"x"', False), ("7", True), ("null", True)]),
    ({"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]},
     [("-3", True), ("5", False), ("0", False), ("11", True), ("10", False)]),
    ({"oneOf": [{"enum": ["a", "b", "c"]}, {"type": "string", "maxLength": 1}]},
     [('"a"', False), ('"d"', True), ('"ab"', False), ('""', True), ("1", False)]),
    ({"oneOf": [{"type": "boolean"}, {"const": True}, {"type": "null"}]}, [("true", False), ("false", True), ("null", True)]),
    ({"not": {"type": "null"}}, [("null", False), ("1", True), ('"x"', True)]),
    ({"type": "string", "not": {"enum": ["ab", "a", "abc"]}},
     [('"a"', False), ('"ab"', False), ('"abc"', False), ('"abcd"', True), ('""', True), ('"ac"', True), ('"b"', True)]),
    ({"type": "number", "not": {"enum": [1, 2.5]}}, [("1", False), ("2.5", False), ("2", True), ("1.5", True), ("-1", True)]),
    ({"type": "object", "not": {"required": ["x"]}, "properties": {"x": {}, "y": {"type": "integer"}}},
     [('{"x":1}', False), ('{"y":1}', True), ("{}", True)]),
    ({"not": {"anyOf": [{"type": "string"}, {"type": "number", "minimum": 3}]}},
     [('"s"', False), ("3", False), ("2", True), ("null", True)]),
    ({"type": "array", "not": {"minItems": 2}}, [("[]", True), ("[1]", True), ("[1,2]", False)]),
]



@pytest.mark.parametrize("schema, docs", CASES, ids=[json.dumps(s)[:60] for s, _ in CASES])
def test_verdicts_agree_with_jsonschema(schema, docs):
    assert_verdicts_agree(schema, docs)


def _sample(schema, rng: random.Random, max_steps: int = 120) -> str | None:
    """A document drawn under the masks over single bytes (structural bytes favoured, EOS taken
    with probability 0.3 where allowed); None when it does not end within max_steps."""
    h, br = session(schema)
    out = bytearray()
    for _ in range(max_steps):
        if not br:                     # the document is complete: the controller stopped
            return out.decode()
        allowed = list(br[0].allowed()) if br[0].mask is not None else []
        assert allowed, (schema, bytes(out), h.logs)
        if EOS in allowed and rng.random() < 0.3:
            return out.decode()
        toks = [t for t in allowed if t != EOS]
        if not toks:
            return out.decode()
        weights = [8 if BYTES[t] in (b"{", b"}", b'"', b",", b":", b"[", b"]") else 1 for t in toks]
        t = rng.choices(toks, weights)[0]
        out += BYTES[t]
        br = h.step([t], sampled=t)
    return None


@pytest.mark.parametrize("schema", [KEYS, SHAPES, CASES[4][0], CASES[5][0], CASES[8][0], CASES[10][0]],
                         ids=["keys", "shapes", "ranges", "enum-vs-length", "not-enum", "not-required"])
def test_sampled_documents_validate(schema):
    rng = random.Random(7)
    done = 0
    for _ in range(12):
        doc = _sample(schema, rng)
        if doc is None:
            continue
        assert valid_by_jsonschema(schema, doc), (schema, doc)
        done += 1
    assert done >= 4


def test_a_schema_whose_one_of_no_document_meets_is_refused():
    """Glaive's calculate_area_4493ae68: `dimensions` requires all four keys, and is a oneOf of
    three `required` sets, so every object meets all three branches."""
    dims = {"type": "object", "properties": {k: {"type": "number"} for k in ("radius", "side", "base", "height")},
            "required": ["radius", "side", "base", "height"],
            "oneOf": [{"required": ["radius"]}, {"required": ["side"]}, {"required": ["base", "height"]}]}
    schema = {"type": "object", "properties": {"shape": {"type": "string"}, "dimensions": dims},
              "required": ["shape", "dimensions"]}
    h, br = session(schema)
    assert br == [] and "json: the schema admits no document" in "".join(h.logs), h.logs


def test_a_property_that_admits_no_value_is_not_offered():
    """An optional property whose schema (its own machine, through $ref) admits nothing: the key is
    never offered, so no document gets stuck after it."""
    schema = {"$defs": {"e": {"type": "object", "required": ["x"], "properties": {"x": False}}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/e"}, "b": {"type": "integer"}},
              "additionalProperties": False}
    assert walk(schema, '{"a":{}}') == ("rejected", 2)
    assert walk(schema, '{"b":1}')[0] == "accepted"
    h, br = session({"$defs": schema["$defs"], "type": "object", "properties": {"a": {"$ref": "#/$defs/e"}},
                     "required": ["a"]})
    assert br == [] and "json: the schema admits no document" in "".join(h.logs), h.logs


@pytest.mark.parametrize("schema", [
    {"not": {"type": "string", "pattern": "^a"}},               # no complement of a pattern
    {"not": {"type": "integer"}},                                # "numbers that are no integers"
    {"not": {"oneOf": [{"type": "string"}, {"type": "null"}]}},
])
def test_not_without_a_written_complement_is_an_error(schema):
    h, br = session(schema)
    assert br == [] and any(line.startswith("json: unsupported: not at #") for line in h.logs), h.logs
