"""The json controller's compile-time checks and the defects of issue 29, each with a test, and a
differential fuzz of oneOf / not / anyOf / allOf against the `jsonschema` package: random schemas
from the keywords docs/json.md lists, a pool of instances; zero invalid instances accepted.
"""
from __future__ import annotations

import json
import sys

import pytest

from _json_cases import Checker, VocabTokenizer
from aicirt.build.toolchain import build_cached

jsonschema = pytest.importorskip("jsonschema")
hyp = pytest.importorskip("hypothesis")
st = hyp.strategies


@pytest.fixture(scope="module")
def ck():
    tok = VocabTokenizer([bytes([i]) for i in range(256)] + [b""], 256)
    c = Checker(tok, build_cached("json").read_bytes())
    yield c
    c.close()


def verdicts(ck, schema, docs):
    """(error or None, {doc: accepted})."""
    h, err, _ = ck.open(schema)
    try:
        return err, ({} if err else {d: ck.accepts(h, d.encode())[0] for d in docs})
    finally:
        ck.close_handle(h)


def test_one_of_with_not_enum_is_exact(ck):
    """`false` meets two branches (boolean, not 2): rejected; so is `true` (three)."""
    for neg in ({"enum": [2]}, {"const": 2}, {"enum": [2, 5]}):
        schema = {"oneOf": [{"type": "boolean"}, {"not": neg}, {"enum": [True]}]}
        err, v = verdicts(ck, schema, ["false", "true", "2", "3", "null", '"x"'])
        assert err is None, err
        assert v == {"false": False, "true": False, "2": False, "3": True, "null": True, '"x"': True}, (schema, v)


def test_const_beside_enum_is_their_intersection(ck):
    assert "admits no document" in verdicts(ck, {"const": False, "enum": [2]}, [])[0]
    err, v = verdicts(ck, {"const": False, "enum": [2, False]}, ["false", "2"])
    assert err is None and v == {"false": True, "2": False}


MALFORMED = [
    ({"type": "number", "maximum": "abc"}, "#/maximum (not a number)"),
    ({"type": "number", "minimum": None}, "#/minimum (not a number)"),
    ({"type": "object", "required": "a"}, "#/required (not an array of strings)"),
    ({"type": "object", "required": [1]}, "#/required (not an array of strings)"),
    ({"type": "object", "properties": []}, "#/properties (not an object)"),
    ({"type": "object", "properties": {"a": 3}}, "#/properties (a value that is no schema)"),
    ({"type": "string", "maxLength": -1}, "#/maxLength (not a non-negative integer)"),
    ({"type": "string", "minLength": 1.5}, "#/minLength (not a non-negative integer)"),
    ({"type": "string", "pattern": 5}, "#/pattern (not a string)"),
    ({"type": "number", "multipleOf": 0}, "#/multipleOf (not a number above 0)"),
    ({"enum": "a"}, "#/enum (not an array)"),
    ({"type": 7}, "#/type (not a type name or an array of them)"),
    ({"anyOf": []}, "#/anyOf (not a non-empty array)"),
    ({"oneOf": [1]}, "#/oneOf (an item that is no schema)"),
    ({"allOf": {}}, "#/allOf (not a non-empty array)"),
    ({"type": "object", "additionalProperties": 1}, "#/additionalProperties (not a schema"),
    ({"type": "array", "items": "x"}, "#/items (not a schema or an array of schemas)"),
    ({"type": "object", "properties": {"a": {"type": "integer", "maximum": "9"}}}, "#/properties/a/maximum"),
    ({"type": "object", "allOf": [{"required": "a"}]}, "#/allOf/0/required (not an array of strings)"),
    ({"$defs": {"n": {"minimum": []}}, "$ref": "#/$defs/n"}, "#/$defs/n/minimum (not a number)"),
]


@pytest.mark.parametrize("schema,message", MALFORMED, ids=[m[1][:40] for m in MALFORMED])
def test_malformed_keyword_values_are_refused_with_their_pointer(ck, schema, message):
    err, _ = verdicts(ck, schema, [])
    assert err is not None and "bad schema: value at " + message in err, err


def test_draft_forms(ck):
    """Draft 4's boolean exclusive bounds are enforced; draft 3's keywords (`required: true` in a
    property, divisibleBy, disallow, extends) are refused, not skipped; `required: false` says
    nothing."""
    err, v = verdicts(ck, {"type": "number", "minimum": 1, "exclusiveMinimum": True}, ["1", "2"])
    assert err is None and v == {"1": False, "2": True}
    err, _ = verdicts(ck, {"type": "object", "properties": {"a": {"type": "integer", "required": True}}}, [])
    assert err is not None and "unsupported: required at #/properties/a" in err, err
    err, _ = verdicts(ck, {"type": "object", "properties": {"a": {"type": "integer", "required": False}}}, [])
    assert err is None, err
    for kw, v in (("divisibleBy", 2), ("disallow", "string"), ("extends", {"type": "integer"})):
        err, _ = verdicts(ck, {kw: v}, [])
        assert err is not None and f"unsupported: {kw} at #" in err, err


REF_LOOPS = [
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, "allOf at #/$defs/a/allOf/0"),
    ({"allOf": [{"$ref": "#"}], "type": "object"}, "allOf at #/allOf/0"),
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}], "type": "integer"}},
      "$ref": "#/$defs/a"}, "allOf at #/$defs/a/allOf/0"),
]


@pytest.mark.parametrize("schema,where", REF_LOOPS)
def test_ref_loops_through_all_of_are_a_checked_limit(ck, schema, where):
    """Not a trap ("call stack exhausted"): an error naming the loop's start."""
    err, _ = verdicts(ck, schema, [])
    assert err is not None and where in err and "$ref loop through allOf" in err, err


def test_ref_loops_through_any_of_compile_or_are_refused(ck):
    """kinds_of / top_literals look at most 32 levels deep: a loop through anyOf is no trap."""
    schema = {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "integer"}]}},
              "oneOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}
    err, _ = verdicts(ck, schema, [])
    assert err is None or "unsupported: oneOf" in err, err


@pytest.mark.parametrize("wrap", [lambda d: {"type": "object", "properties": {"a": d}}, lambda d: {"allOf": [d]},
                                  lambda d: {"anyOf": [d]}, lambda d: {"items": d}, lambda d: {"not": d}])
def test_deep_schemas_are_a_checked_limit(ck, wrap):
    d = {"type": "integer"}
    for _ in range(1000):
        d = wrap(d)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))   # json.dumps of the schema in Checker.open
    try:
        err, _ = verdicts(ck, d, [])
    finally:
        sys.setrecursionlimit(old)
    assert err is not None and "nested too deeply" in err, err


def test_closed_all_of_part_beside_sibling_properties(ck):
    """A closed allOf part (additionalProperties false) with sibling properties: the keys the part
    lists are allowed, the sibling's others are not; the empty object is valid."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "allOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": False}]}
    err, v = verdicts(ck, schema, ['{"a":1}', "{}", '{"a":1,"b":1}'])
    assert err is None and v == {'{"a":1}': True, "{}": True, '{"a":1,"b":1}': False}, (err, v)


# ---- differential fuzz against jsonschema ---------------------------------------------------
POOL = [None, True, False, 0, 1, 2, -1, 5, 1.5, -2.5, "", "a", "ab", "abc", "b", [], [1], [1, 2], ["a"], {}, {"a": 1},
        {"b": "x"}, {"a": "x", "b": 2}]
SCALARS = [None, True, False, 0, 1, 2, 5, -1, 1.5, "", "a", "ab", "b"]
TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]


@st.composite
def schemas(draw, depth=0):
    kinds = ["type", "enum", "const", "num", "str", "arr", "obj"]
    if depth < 3:
        kinds += ["not", "anyOf", "oneOf", "allOf"] * 2
    s = {}
    for kind in draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=2, unique=True)):
        if kind == "type":
            t = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=2, unique=True))
            s["type"] = t[0] if len(t) == 1 else t
        elif kind == "enum":
            s["enum"] = draw(st.lists(st.sampled_from(SCALARS), min_size=1, max_size=3, unique_by=json.dumps))
        elif kind == "const":
            s["const"] = draw(st.sampled_from(SCALARS))
        elif kind == "num":
            s[draw(st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]))] = draw(st.integers(-1, 3))
        elif kind == "str":
            s[draw(st.sampled_from(["minLength", "maxLength"]))] = draw(st.integers(0, 2))
        elif kind == "arr":
            s[draw(st.sampled_from(["minItems", "maxItems"]))] = draw(st.integers(0, 2))
        elif kind == "obj":
            s["required"] = draw(st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2, unique=True))
        elif kind == "not":
            s["not"] = draw(schemas(depth + 1))
        else:
            s[kind] = draw(st.lists(schemas(depth + 1), min_size=1, max_size=3))
    return s


def check_no_invalid_accepted(ck, schema):
    docs = {json.dumps(v, separators=(",", ":")): v for v in POOL}
    err, v = verdicts(ck, schema, list(docs))
    if err is not None:
        assert "unsupported" in err or "admits no document" in err, (schema, err)
        return
    bad = [d for d, ok in v.items() if ok and not jsonschema.Draft202012Validator(schema).is_valid(docs[d])]
    assert not bad, (schema, bad)


SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(hyp.HealthCheck))


@hyp.settings(max_examples=40, **SETTINGS)
@hyp.given(schema=schemas())
def test_fuzz_no_invalid_instance_accepted(ck, schema):
    check_no_invalid_accepted(ck, schema)


@pytest.mark.slow
@hyp.settings(max_examples=600, **SETTINGS)
@hyp.given(schema=schemas())
def test_fuzz_no_invalid_instance_accepted_many(ck, schema):
    check_no_invalid_accepted(ck, schema)


OVERSIZE = [
    ({"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(2000)}},
     "too large: properties at # (2000 properties; at most 1024 an object)"),
    ({"type": "object", "properties": {f"k{i}": {"type": "string", "pattern": "^[a-z]{1,20}$"} for i in range(20000)}},
     "too large: properties at # (20000 properties"),
    ({"type": "object", "properties": {f"key_number_{i}": {"enum": [f"value_{j}_{i}" for j in range(50)]}
                                       for i in range(1000)}},
     "too large: schema at # (its 1002 machines' regexes take"),
]


@pytest.mark.parametrize("schema,message", OVERSIZE, ids=["2000 properties", "20000 properties", "50000 literals"])
def test_oversize_schemas_are_a_checked_limit(ck, schema, message):
    """Not a guest out-of-memory trap nor 'call stack exhausted': an error naming the limit."""
    err, _ = verdicts(ck, schema, [])
    assert err is not None and message in err, err


def test_large_schemas_under_the_limits_compile(ck):
    schema = {"type": "object", "properties": {f"k{i}": {"type": "string", "pattern": "^[a-z]{1,20}$"} for i in range(1024)}}
    err, v = verdicts(ck, schema, ['{"k1":"ab"}'])
    assert err is None and v == {'{"k1":"ab"}': True}, err
