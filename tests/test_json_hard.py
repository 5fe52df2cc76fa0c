"""The `json` controller on schemas past the benchmark slices: objects with dozens of optional
properties (Kubernetes ObjectMeta-like), `oneOf` whose branches overlap on values that are no
objects, int64 bounds, `enum` beside long `maxLength`s. Each case failed (or was refused) before
the fix it pins."""
from __future__ import annotations

import pytest

from test_json_schema import walk

# Kubernetes' ObjectMeta: 16 optional properties, none required; nested under a Deployment-like
# object whose first required key comes after 40 optional ones.
OBJECT_META = {"type": "object", "properties": {
    k: {"type": "string"} for k in ("annotations", "clusterName", "creationTimestamp", "deletionGracePeriodSeconds",
                                    "deletionTimestamp", "finalizers", "generateName", "generation", "labels",
                                    "managedFields", "name", "namespace", "ownerReferences", "resourceVersion",
                                    "selfLink", "uid")}}
MANY_OPTIONAL = {"type": "object", "properties": {**{f"opt{i}": {"type": "integer"} for i in range(40)},
                                                  "metadata": OBJECT_META, "kind": {"const": "Deployment"},
                                                  **{f"late{i}": {"type": "boolean"} for i in range(20)}},
                 "required": ["kind"], "additionalProperties": False}


@pytest.mark.parametrize("text, verdict", [
    ('{"kind":"Deployment"}', "accepted"),
    ('{"opt0":1,"opt39":2,"metadata":{"name":"web","uid":"x"},"kind":"Deployment","late19":true}', "accepted"),
    ('{"opt7":1,"kind":"Deployment","late0":false,"late3":true}', "accepted"),
    ('{"metadata":{},"kind":"Deployment"}', "accepted"),
    ('{"opt1":1}', "rejected"),                              # the required key is missing
    ('{"opt2":1,"opt1":1,"kind":"Deployment"}', "rejected"),  # keys in schema order only
    ('{"opt1":1,"opt1":2,"kind":"Deployment"}', "rejected"),  # no key twice
    ('{"kind":"Deployment","bogus":1}', "rejected"),
])
def test_objects_with_many_optional_properties_compile_and_hold(text, verdict):
    assert walk(MANY_OPTIONAL, text)[0] == verdict


def test_hundreds_of_optional_properties_and_none_required():
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}}
    assert walk(schema, "{}")[0] == "accepted"
    assert walk(schema, '{"p0":1,"p150":2,"p299":3,"other":null}')[0] == "accepted"
    assert walk(schema, '{"p150":2,"p0":1}')[0] == "rejected"


def _kind(v):
    return {"properties": {"kind": {"const": v}, "children": {"type": "array"}}, "required": ["kind"]}


@pytest.mark.parametrize("text, verdict", [
    ('{"kind":"a"}', "accepted"),
    ('{"kind":"b","children":[7]}', "accepted"),
    ('{"kind":"c"}', "rejected"),
    # no "type": "object": every value that is no object matches both branches, so none is valid
    ("7", "rejected"), ('"s"', "rejected"), ("null", "rejected"), ("[7]", "rejected"), ("true", "rejected"),
])
def test_one_of_without_type_object_rejects_values_matching_both(text, verdict):
    assert walk({"oneOf": [_kind("a"), _kind("b")]}, text)[0] == verdict


def test_one_of_nested_in_an_array_the_held_out_shape():
    node = {"oneOf": [_kind("leaf"), _kind("branch")]}
    schema = {"type": "object", "properties": {"children": {"type": "array", "items": node}}, "required": ["children"]}
    assert walk(schema, '{"children":[{"kind":"leaf"}]}')[0] == "accepted"
    assert walk(schema, '{"children":[7]}')[0] == "rejected"


@pytest.mark.parametrize("branches", [
    [{"type": "string", "maxLength": 5}, {"type": "string", "pattern": "^a"}],
    [{"type": "number"}, {"type": "integer"}],           # 1 matches both, 1.5 one: no type says "not integer"
    [{"required": ["a"]}, {"required": ["b"]}],
])
def test_one_of_that_may_overlap_is_refused(branches):
    verdict, log = walk({"oneOf": branches}, "1")
    assert verdict == "error" and "unsupported: oneOf at #" in log


def test_one_of_disjoint_by_type_and_by_literal_still_compiles():
    assert walk({"oneOf": [{"type": "integer"}, {"type": "string"}]}, '"x"')[0] == "accepted"
    assert walk({"oneOf": [{"enum": [1, 2]}, {"enum": [3]}]}, "3")[0] == "accepted"


INT64 = {"type": "integer", "minimum": -9223372036854775808, "maximum": 9223372036854775807}


@pytest.mark.parametrize("text, verdict", [
    ("9223372036854775807", "accepted"), ("-9223372036854775808", "accepted"), ("0", "accepted"),
    ("9223372036854775808", "rejected"), ("-9223372036854775809", "rejected"),
])
def test_int64_bounds_are_exact(text, verdict):
    assert walk(INT64, text)[0] == verdict


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "integer", "minimum": 0, "maximum": 1e30}, "maximum"),
    ({"type": "integer", "minimum": -1e30, "maximum": 0}, "minimum"),
    ({"type": "number", "exclusiveMaximum": 1e40}, "exclusiveMaximum"),
])
def test_an_out_of_range_bound_names_its_own_keyword(schema, keyword):
    verdict, log = walk(schema, "1")
    assert verdict == "error" and f"unsupported: {keyword} at #" in log


@pytest.mark.parametrize("max_length", [24, 25, 300])
def test_enum_with_a_long_max_length(max_length):
    schema = {"type": "string", "enum": ["alpha", "beta", "x" * 30], "maxLength": max_length}
    assert walk(schema, '"alpha"')[0] == "accepted"
    assert walk(schema, '"gamma"')[0] == "rejected"
    assert walk(schema, '"' + "x" * 30 + '"')[0] == ("accepted" if max_length >= 30 else "rejected")


def test_enum_with_max_length_nested_in_an_array_is_not_empty_only():
    schema = {"type": "array", "items": {"type": "string", "enum": ["red", "green"], "maxLength": 64}, "minItems": 1}
    assert walk(schema, '["red","green"]')[0] == "accepted"
    assert walk(schema, '["blue"]')[0] == "rejected"


LOWER_KEYS = {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}}, "required": ["name"],
              "additionalProperties": False}
X_KEYS = {"type": "object", "properties": {"id": {"type": "string"}}, "patternProperties": {"^x-": {"type": "integer"}}}


@pytest.mark.parametrize("schema, text, verdict", [
    # a required key that only a pattern covers (additionalProperties false): its schema, once
    (LOWER_KEYS, '{"name":1}', "accepted"),
    (LOWER_KEYS, '{"name":1,"abc":2}', "accepted"),
    (LOWER_KEYS, '{"abc":2}', "rejected"),
    (LOWER_KEYS, '{"name":1,"name":2}', "rejected"),
    (LOWER_KEYS, '{"name":"x"}', "rejected"),
    (LOWER_KEYS, '{"name":1,"X":2}', "rejected"),
    # keys that match no pattern follow additionalProperties (absent: anything)
    (X_KEYS, '{"id":"a","x-a":1,"other":[1],"idd":true,"zé\\"q":null}', "accepted"),
    (X_KEYS, '{"zzz":1}', "accepted"),
    (X_KEYS, '{"x-b":"s"}', "rejected"),
    (X_KEYS, '{"id":"a","id":"b"}', "rejected"),
    ({**X_KEYS, "additionalProperties": {"type": "boolean"}}, '{"zz":true,"x-1":2}', "accepted"),
    ({**X_KEYS, "additionalProperties": {"type": "boolean"}}, '{"zz":1}', "rejected"),
    # a listed key a pattern matches: both schemas
    ({"type": "object", "properties": {"x-n": {"minimum": 5}}, "patternProperties": {"^x-": {"type": "integer"}}},
     '{"x-n":7}', "accepted"),
    ({"type": "object", "properties": {"x-n": {"minimum": 5}}, "patternProperties": {"^x-": {"type": "integer"}}},
     '{"x-n":3}', "rejected"),
])
def test_pattern_properties_with_listed_required_and_other_keys(schema, text, verdict):
    assert walk(schema, text)[0] == verdict


def test_pattern_covered_required_key_behind_a_ref():
    schema = {"$defs": {"m": {"type": "object", "patternProperties": {"^v[0-9]+$": {"type": "string"}},
                              "required": ["v1"], "additionalProperties": False}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/m"}}, "required": ["a"]}
    assert walk(schema, '{"a":{"v1":"x","v22":"y"}}')[0] == "accepted"
    assert walk(schema, '{"a":{"v2":"x"}}')[0] == "rejected"


ANY_ORDER = b"\0fast_forward=0\0any_order"
AO_OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
          "required": ["a", "c"], "additionalProperties": False}


@pytest.mark.parametrize("schema, text, verdict", [
    (AO_OBJ, '{"a":1,"c":true}', "accepted"),
    (AO_OBJ, '{"c":true,"a":1}', "accepted"),
    (AO_OBJ, '{"b":"x","c":false,"a":2}', "accepted"),
    (AO_OBJ, '{"a":1,"a":2,"c":true}', "rejected"),      # each key at most once
    (AO_OBJ, '{"c":true,"b":"x"}', "rejected"),          # every required key
    (AO_OBJ, '{"a":1,"c":true,"d":1}', "rejected"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"x":1,"a":2,"y":[3]}', "accepted"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"x":1,"a":2,"a":4}', "rejected"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1}, "{}", "rejected"),
])
def test_any_order_keys_in_any_order_each_at_most_once(schema, text, verdict):
    assert walk(schema, text, options=ANY_ORDER)[0] == verdict


def test_any_order_in_the_schema_root_and_on_many_keys():
    items = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(40)}, "required": ["k39"],
             "additionalProperties": False}
    schema = {"x-aicirt": {"any_order": True}, "type": "array", "items": items}
    assert walk(schema, '[{"k39":1,"k0":2},{"k5":1,"k39":3,"k1":0},{"k0":2,"k39":1}]')[0] == "accepted"
    assert walk(schema, '[{"k39":1,"k39":2}]')[0] == "rejected"
    assert walk(schema, '[{"k0":1}]')[0] == "rejected"


JSON_PATCH_OP = {"type": "object", "required": ["op", "path"], "properties": {"path": {"type": "string"}},
                 "oneOf": [{"properties": {"op": {"enum": ["add", "test"]}, "value": {}}, "required": ["value"]},
                           {"properties": {"op": {"enum": ["remove"]}}}]}
XAPI_IFI = {"oneOf": [
    {"type": "object", "properties": {"mbox": {"type": "string"}}, "patternProperties": {"^(sha|acct)$": {"type": "null"}},
     "required": ["mbox"]},
    {"type": "object", "properties": {"sha": {"type": "string"}}, "patternProperties": {"^(mbox|acct)$": {"type": "null"}},
     "required": ["sha"]}]}


@pytest.mark.parametrize("schema, text, verdict", [
    # the key the siblings require tells the branches apart
    (JSON_PATCH_OP, '{"path":"/a","op":"remove"}', "accepted"),
    (JSON_PATCH_OP, '{"path":"/a","op":"add","value":1}', "accepted"),
    (JSON_PATCH_OP, '{"path":"/a","op":"add"}', "rejected"),
    (JSON_PATCH_OP, '{"path":"/a","op":"remove","value":1}', "accepted"),   # branch 2 only
    # a required key's value kinds differ (string in one, null by a pattern in the other)
    (XAPI_IFI, '{"mbox":"x"}', "accepted"),
    (XAPI_IFI, '{"sha":"y","mbox":null}', "accepted"),
    (XAPI_IFI, '{"mbox":"x","sha":"y"}', "rejected"),
    # nested literal branches
    ({"oneOf": [{"oneOf": [{"enum": ["a", "b"]}, {"enum": ["c"]}]}, {"enum": ["d"]}]}, '"c"', "accepted"),
    ({"oneOf": [{"oneOf": [{"enum": ["a", "b"]}, {"enum": ["c"]}]}, {"enum": ["d"]}]}, '"e"', "rejected"),
])
def test_one_of_disjoint_by_required_keys_values(schema, text, verdict):
    assert walk(schema, text)[0] == verdict
