"""The `json` controller on schemas past the benchmark slices: objects with dozens of optional
properties (Kubernetes ObjectMeta-like), `oneOf` whose branches overlap on values that are no
objects, int64 bounds, `enum` beside long `maxLength`s. Each case failed (or was refused) before
the fix it pins."""
from __future__ import annotations

import pytest

from test_json_schema import session, walk

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
    [{"type": "string", "format": "email"}, {"type": "string", "maxLength": 5}],   # no complement of a format
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


# ---- string constraints combined exactly (lencount.c): a pattern or format beside lengths it
# does not imply. Before: the pattern's unbounded repeats and unanchored ends were capped to fit
# maxLength (narrower), so these valid strings were rejected.
@pytest.mark.parametrize("schema, text, verdict", [
    ({"type": "string", "pattern": "^[A-Za-z0-9]+(-[A-Za-z0-9]+)*$", "maxLength": 50}, '"example-org"', "accepted"),
    ({"type": "string", "pattern": "^[A-Za-z0-9]+(-[A-Za-z0-9]+)*$", "maxLength": 50}, '"' + "a-" * 24 + 'bc"', "accepted"),
    ({"type": "string", "pattern": "^[A-Za-z0-9]+(-[A-Za-z0-9]+)*$", "maxLength": 50}, '"' + "a-" * 25 + 'b"', "rejected"),
    ({"type": "string", "pattern": "ab", "maxLength": 4}, '"abxx"', "accepted"),
    ({"type": "string", "pattern": "ab", "maxLength": 4}, '"xxab"', "accepted"),
    ({"type": "string", "pattern": "ab", "maxLength": 4}, '"xxxab"', "rejected"),
    ({"type": "string", "pattern": "ab", "maxLength": 255}, '"' + "x" * 200 + 'ab"', "accepted"),
    ({"type": "array", "items": {"type": "string", "pattern": "ab", "maxLength": 4}}, '["abxx","ab","xab"]', "accepted"),
    ({"type": "array", "items": {"type": "string", "pattern": "ab", "maxLength": 4}}, '["abxx","b"]', "rejected"),
    ({"type": "string", "pattern": "ab", "maxLength": 255}, '"' + "x" * 254 + 'ab"', "rejected"),
    # minLength beside a pattern that does not imply it, and escapes counting as one character
    ({"type": "string", "pattern": "^https?://", "minLength": 11}, '"http://a.io"', "accepted"),
    ({"type": "string", "pattern": "^https?://", "minLength": 11}, '"http://a.i"', "rejected"),
    ({"type": "string", "pattern": "^[^x]*$", "minLength": 3, "maxLength": 3}, '"\\n\\u00e9\\""', "accepted"),
    # format beside lengths: exact too (before: email narrowed to fixed shapes, others refused)
    ({"type": "string", "format": "email", "maxLength": 12}, '"abcdefg@b.cc"', "accepted"),
    ({"type": "string", "format": "email", "maxLength": 12}, '"abcdefgh@b.cc"', "rejected"),
    ({"type": "string", "format": "uri", "maxLength": 20}, '"https://example.org"', "accepted"),
    ({"type": "string", "format": "hostname", "minLength": 5}, '"ab.c"', "rejected"),
    ({"type": "string", "format": "hostname", "minLength": 5}, '"ab.cd"', "accepted"),
    # bounds past 262144 (refused before: a block machine per 128 characters); int32's largest
    ({"type": "string", "minLength": 3, "maxLength": 2147483647}, '"abc"', "accepted"),
    ({"type": "string", "minLength": 3, "maxLength": 2147483647}, '"ab"', "rejected"),
    ({"type": "string", "pattern": "^[a-z]{3}$", "maxLength": 1000000}, '"abc"', "accepted"),
    # refused before ("together with format / pattern")
    ({"type": "string", "format": "email", "maxLength": 8}, '"a@b.cc"', "accepted"),
    ({"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "minLength": 3}, '"a-b"', "accepted"),
    ({"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "minLength": 3}, '"ab"', "rejected"),
])
def test_pattern_and_format_with_lengths_are_exact(schema, text, verdict):
    assert walk(schema, text)[0] == verdict


def test_a_max_length_below_the_patterns_shortest_string_admits_none():
    verdict, log = walk({"type": "string", "pattern": "^abcd", "maxLength": 3}, '"abc"')
    assert verdict == "error" and "the schema admits no document" in log
    schema = {"type": "array", "items": {"type": "string", "pattern": "^abcd", "maxLength": 3}}
    assert walk(schema, "[]")[0] == "accepted"
    assert walk(schema, '["abcd"]')[0] == "rejected"


def _valid_strings(pattern, lo, hi, alphabet):
    import itertools
    import re
    return {"".join(t) for n in range(lo, hi + 1) for t in itertools.product(alphabet, repeat=n)
            if re.search(pattern, "".join(t))}


@pytest.mark.parametrize("pattern, lo, hi", [
    ("ab", 0, 5), ("^[ab]+(-[ab]+)*$", 0, 5), ("^(ab|c)*$", 3, 6), ("b-?$", 2, 5), ("^a|c$", 2, 4), ("a.*b", 4, 5),
])
def test_counted_masks_allow_exactly_the_bytes_some_valid_string_continues(pattern, lo, hi):
    """Every prefix of every valid string over a small alphabet (all of them, enumerated): the
    mask allows a byte of the alphabet, or the closing quote, iff some valid string continues it."""
    alphabet = "ab-c"
    valid = _valid_strings(pattern, lo, hi, alphabet)
    prefixes = sorted({v[:i] for v in valid for i in range(len(v) + 1)})
    schema = {"type": "string", "pattern": pattern, "maxLength": hi, **({"minLength": lo} if lo else {})}
    h, br = session(schema)
    br = h.step([ord('"')], sampled=ord('"'))
    path = ""
    for p in prefixes:
        common = 0
        while common < min(len(path), len(p)) and path[common] == p[common]:
            common += 1
        if p != path:
            toks = [ord(ch) for ch in p[common:]]
            br = h.step(toks, backtrack=len(path) - common, sampled=toks[-1] if toks else None)
            path = p
        allowed = br[0].allowed()
        want = {ord(c) for c in alphabet if p + c in prefixes} | ({ord('"')} if p in valid else set())
        assert allowed & {ord(c) for c in alphabet + '"'} == want, (p, sorted(map(chr, allowed)), sorted(map(chr, want)))


def test_a_document_that_outgrows_memory_ends_with_a_clear_error_not_a_trap():
    """An unanchored pattern whose DFA has a state per window of the last 15 characters: every
    new window builds a 1 KiB row. Past `memory_mib` the sequence ends with the log line that
    says so (by default 56 MiB, below the host's 64 MiB limit where the allocation would trap)."""
    import random
    rng = random.Random(1)
    text = '"' + "".join(rng.choice("ab") for _ in range(400)) + '"'
    h, br = session({"type": "string", "pattern": "a[ab]{14}$"}, options=b"\0fast_forward=0\0memory_mib=3")
    for ch in text.encode():
        if not br:
            break
        assert ch in br[0].allowed()
        br = h.step([ch], sampled=ch)
    assert not br, "the document should outgrow 3 MiB"
    assert "json: out of memory: guest memory reached" in h.logs[-1], h.logs[-3:]
