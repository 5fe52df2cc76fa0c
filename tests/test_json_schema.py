"""The `json` controller, keyword by keyword: documents accepted and rejected token by token
under its masks (byte vocabulary and Qwen2's), errors for what it cannot enforce, options, and
fast-forward of forced text."""
from __future__ import annotations

import functools
import json

import pytest

from _sdk_host import MiniHost
from _vocabs import greedy_tokenize, qwen_token_bytes
from aicirt.build.toolchain import build_cached

BYTES = [bytes([i]) for i in range(256)] + [b""]
EOS = 256


@functools.cache
def json_wasm() -> bytes:
    return build_cached("json").read_bytes()


def session(schema, options=b"\0fast_forward=0", vocab=BYTES, eos=EOS, encode=lambda s: []):
    arg = schema if isinstance(schema, bytes) else json.dumps(schema).encode()
    h = MiniHost(json_wasm(), vocab, eos, encode, arg=arg + options)
    return h, h.step([1, 2, 3])


def walk(schema, text: str, vocab=BYTES, eos=EOS, options=b"\0fast_forward=0"):
    """('accepted' | 'rejected' | 'cannot end' | 'error', detail)."""
    h, br = session(schema, options, vocab, eos)
    if not br:
        return "error", "".join(h.logs)
    data = text.encode()
    toks = list(data) if vocab is BYTES else greedy_tokenize(vocab, data)
    for i, t in enumerate(toks):
        if not br or br[0].mask is None or t not in br[0].allowed():
            return "rejected", i
        br = h.step([t], sampled=t)
    return ("accepted" if not br or eos in br[0].allowed() else "cannot end"), None


def valid_by_jsonschema(schema, doc: str) -> bool:
    """`jsonschema`'s verdict, formats checked."""
    import jsonschema
    try:
        jsonschema.validate(json.loads(doc), schema, format_checker=jsonschema.FormatChecker())
        return True
    except jsonschema.ValidationError:
        return False


def assert_verdicts_agree(schema, docs) -> None:
    """Each (document, valid) of `docs`: `jsonschema` agrees with the case, and the masks accept
    the document exactly when it is valid."""
    for doc, valid in docs:
        assert valid_by_jsonschema(schema, doc) == valid, (doc, "the case's own expectation is wrong")
        got, detail = walk(schema, doc)
        assert got != "error", detail
        assert (got == "accepted") == valid, (schema, doc, got, detail)


OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["b"]}
TREE = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                           "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                           "required": ["v"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}
EVERY_KEY = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "integer"}},
             "patternProperties": {".*": {"type": "string"}}, "required": ["a"]}
CASES = [
    # (schema, text, accepted?)
    ({"type": "integer"}, "-42", True),
    ({"type": "integer"}, "4.5", False),
    ({"type": "integer"}, "012", False),
    ({"type": "integer", "minimum": 10, "maximum": 250}, "250", True),
    ({"type": "integer", "minimum": 10, "maximum": 250}, "251", False),
    ({"type": "integer", "minimum": 10, "maximum": 250}, "9", False),
    ({"type": "integer", "exclusiveMinimum": -3, "maximum": -1}, "-2", True),
    ({"type": "integer", "exclusiveMinimum": -3, "maximum": -1}, "-3", False),
    ({"type": "number", "minimum": 0, "maximum": 1}, "0.25", True),
    ({"type": "number", "minimum": 0, "maximum": 1}, "1.0", True),
    ({"type": "number", "minimum": 0, "maximum": 1}, "1.5", False),
    ({"type": "number", "exclusiveMaximum": 1}, "0.999", True),
    ({"type": "number", "exclusiveMaximum": 1}, "1", False),
    ({"type": "number"}, "-1.5e+20", True),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 1.5}, "0.5", True),      # bounds read exactly
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 1.5}, "0.4999", False),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 1.5}, "1.4999", True),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 1.5}, "1.50", False),
    ({"type": "number", "minimum": -90.25, "maximum": 90.25}, "-90.25", True),
    ({"type": "number", "minimum": -90.25, "maximum": 90.25}, "-90.26", False),
    ({"type": "number", "exclusiveMinimum": 0.1, "multipleOf": 0.01}, "0.11", True),
    ({"type": "number", "exclusiveMinimum": 0.1, "multipleOf": 0.01}, "0.105", False),
    ({"type": "number", "multipleOf": 0.01}, "3.14", True),
    ({"type": "number", "multipleOf": 0.01}, "3.141", False),
    ({"type": "string"}, '"tab\\t \\u00e9 é \\"q\\""', True),
    ({"type": "string"}, '"raw\nnewline"', False),
    ({"type": "string", "minLength": 2, "maxLength": 3}, '"abc"', True),
    ({"type": "string", "minLength": 2, "maxLength": 3}, '"a"', False),
    ({"type": "string", "minLength": 2, "maxLength": 3}, '"abcd"', False),
    ({"type": "string", "maxLength": 2}, '"éé"', True),                # characters, not bytes
    # long strings: a chain of machines past 128 characters (blocks, then a short tail)
    ({"type": "string", "maxLength": 600}, '"' + "a" * 600 + '"', True),
    ({"type": "string", "maxLength": 600}, '"' + "a" * 601 + '"', False),
    ({"type": "string", "maxLength": 512}, '"' + "a" * 512 + '"', True),
    ({"type": "string", "maxLength": 512}, '"' + "a" * 513 + '"', False),
    ({"type": "string", "maxLength": 256}, '"' + "a" * 128 + '"', True),
    ({"type": "string", "maxLength": 256}, '"' + "a" * 129 + '"', True),
    ({"type": "string", "maxLength": 256}, '"' + "a" * 256 + '"', True),
    ({"type": "string", "maxLength": 256}, '"' + "a" * 257 + '"', False),
    ({"type": "string", "minLength": 300, "maxLength": 700}, '"' + "é" * 300 + '"', True),
    ({"type": "string", "minLength": 300, "maxLength": 700}, '"' + "é" * 299 + '"', False),
    ({"type": "string", "minLength": 300, "maxLength": 700}, '"' + "\\n" * 700 + '"', True),
    ({"type": "string", "minLength": 300, "maxLength": 700}, '"' + "\\n" * 701 + '"', False),
    ({"type": "string", "minLength": 600}, '"' + "b" * 599 + '"', False),
    ({"type": "string", "minLength": 600}, '"' + "b" * 900 + '"', True),
    ({"type": "string", "maxLength": 131072}, '"short"', True),
    ({"type": "string", "pattern": "^[a-z]+[0-9]?$"}, '"abc1"', True),
    ({"type": "string", "pattern": "^[a-z]+[0-9]?$"}, '"abc12"', False),
    ({"type": "string", "pattern": "[0-9]{2}"}, '"x12y"', True),       # search semantics
    ({"type": "string", "pattern": "[0-9]{2}"}, '"x1y"', False),
    ({"type": "string", "pattern": "^a\\.b$"}, '"a.b"', True),
    ({"type": "string", "pattern": "^a\\.b$"}, '"axb"', False),
    ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, '"abcd"', False),
    # pattern with length bounds: lengths counted on the pattern; a maxLength it does not imply
    # bounds its unbounded repeats (and unanchored ends) to fit
    ({"type": "string", "pattern": "^mystring-[a-zA-Z0-9]+$", "minLength": 10, "maxLength": 24}, '"mystring-abcdefghijklmno"', True),
    ({"type": "string", "pattern": "^mystring-[a-zA-Z0-9]+$", "minLength": 10, "maxLength": 24}, '"mystring-abcdefghijklmnop"', False),
    ({"type": "string", "pattern": "^https?://.+$", "maxLength": 1024}, '"https://example.org/a?b"', True),
    ({"type": "string", "pattern": "^https?://.+$", "maxLength": 1024}, '"ftp://example.org"', False),
    ({"type": "string", "pattern": "^([0-9]{5})(-([0-9]{4}))?$", "minLength": 5, "maxLength": 10}, '"12345-6789"', True),
    ({"type": "string", "pattern": "[0-9]{10,10}", "minLength": 10, "maxLength": 10}, '"1234567890"', True),
    ({"type": "string", "pattern": "[0-9]{10,10}", "minLength": 10, "maxLength": 10}, '"a1234567890"', False),
    ({"type": "string", "pattern": "^ab", "maxLength": 5}, '"abcde"', True),
    ({"type": "string", "pattern": "^ab", "maxLength": 5}, '"abcdef"', False),
    # a minLength the pattern does not imply: its unanchored end takes the rest (narrower)
    ({"type": "string", "pattern": "[0-9a-f]+", "minLength": 12, "maxLength": 12}, '"507f191e810c"', True),
    ({"type": "string", "pattern": "[0-9a-f]+", "minLength": 12, "maxLength": 12}, '"507f191e810"', False),
    ({"type": "string", "pattern": "[0-9a-f]+", "minLength": 12, "maxLength": 12}, '"zzzzzzzzzzzz"', False),
    ({"type": "string", "pattern": "^https?://", "minLength": 12}, '"https://a.b"', False),
    ({"type": "string", "pattern": "^https?://", "minLength": 12}, '"http://a.bcd"', True),   # (https: 13 and up)
    ({"type": "string", "format": "date"}, '"2024-02-29"', True),
    ({"type": "string", "format": "date"}, '"2024-13-01"', False),
    ({"type": "string", "format": "date"}, '"2020-02-31"', False),
    ({"type": "string", "format": "date"}, '"2023-02-29"', False),
    ({"type": "string", "format": "date"}, '"2000-02-29"', True),
    ({"type": "string", "format": "date"}, '"1900-02-29"', False),
    ({"type": "string", "format": "date-time"}, '"2024-02-29T12:30:00.5+01:00"', True),
    ({"type": "string", "format": "time"}, '"25:00:00Z"', False),
    ({"type": "string", "format": "email"}, '"first.last@example.org"', True),
    ({"type": "string", "format": "email"}, '"no-at-sign"', False),
    ({"type": "string", "format": "email", "maxLength": 255}, '"first.last@mail.example.org"', True),
    ({"type": "string", "format": "email", "maxLength": 255}, '"first..last@example.org"', False),
    ({"type": "string", "format": "email", "maxLength": 30}, '"abc.de@mail.ex.org"', True),   # narrower: sized to fit
    ({"type": "string", "format": "email", "maxLength": 30}, '"' + "a" * 20 + '@example.org"', False),
    ({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"', True),
    ({"type": "string", "format": "ipv4"}, '"192.168.0.255"', True),
    ({"type": "string", "format": "ipv4"}, '"192.168.0.256"', False),
    ({"type": "string", "format": "ipv6"}, '"2001:db8::ff00:42:8329"', True),
    ({"type": "string", "format": "ipv6"}, '"2001:db8:::1"', False),
    ({"type": "string", "format": "uri"}, '"https://example.org/a?b=c#d"', True),
    ({"type": "string", "format": "uri"}, '"not a uri"', False),
    ({"type": ["string", "null"]}, "null", True),
    ({"type": ["string", "null"]}, "1", False),
    (OBJ, '{"a":1,"b":"x"}', True),
    (OBJ, '{"b":"x"}', True),
    (OBJ, '{"a":1}', False),                                         # required
    (OBJ, '{"b":"x","c":[1,{"d":null}]}', True),                     # additional: any value
    (OBJ, '{"b":"x","a":1}', False),                                 # schema order
    (OBJ, '{"b":"x","b":"y"}', False),                               # no duplicate keys
    ({**OBJ, "additionalProperties": False}, '{"b":"x","c":1}', False),
    ({**OBJ, "additionalProperties": {"type": "boolean"}}, '{"b":"x","c":true}', True),
    ({**OBJ, "additionalProperties": {"type": "boolean"}}, '{"b":"x","c":1}', False),
    ({"type": "object", "required": ["x"]}, '{"x":[]}', True),        # required, not listed
    ({"type": "object", "required": ["x"]}, "{}", False),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, "[1,2]", True),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, "[]", False),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, "[1,2,3]", False),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}, '["a",1]', True),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}, '["a",1,2]', False),
    ({"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "null"}}, '["a",null,null]', True),
    ({"enum": ["red", 1, None, {"k": [True]}]}, '{"k":[true]}', True),
    ({"enum": ["red", 1, None, {"k": [True]}]}, '"blue"', False),
    ({"const": "fixed"}, '"fixed"', True),
    ({"type": "string", "enum": ["a", "bb", 3], "maxLength": 1}, '"bb"', False),   # enum meets the rest
    ({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]}, '"x"', True),
    ({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]}, '"xy"', False),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "7", True),
    ({"oneOf": [{"properties": {"t": {"const": "a"}}, "required": ["t"]},
                {"properties": {"t": {"const": "b"}, "n": {"type": "integer"}}, "required": ["t"]}]},
     '{"t":"b","n":1}', True),
    ({"allOf": [{"properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]}, '{"a":3}', True),
    ({"allOf": [{"properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]}, "{}", False),
    ({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}]}, "6", False),
    ({"properties": {"a": {"$ref": "#/definitions/pos"}}, "definitions": {"pos": {"type": "integer", "minimum": 1}}},
     '{"a":0}', False),
    (TREE, '{"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]}', True),   # recursion
    (TREE, '{"v":1,"kids":[{"v":2,"kids":[{"x":3}]}]}', False),
    ({"patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}, '{"x-a":1}', True),
    ({"patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}, '{"y":1}', False),
    (True, '[{"any":["thing",1.5,null]}]', True),
    # a pattern property every key matches: on listed properties too, in place of additionalProperties
    (EVERY_KEY, '{"a":"x","c":"y"}', True),
    (EVERY_KEY, '{"a":"x","c":1}', False),
    (EVERY_KEY, '{"a":"x","b":1}', False),                           # b: integer and string
    (EVERY_KEY, '{"a":"xyzw"}', False),
    # an integer multipleOf between bounds: the multiples
    ({"type": "integer", "minimum": 16, "maximum": 100, "multipleOf": 4}, "100", True),
    ({"type": "integer", "minimum": 16, "maximum": 100, "multipleOf": 4}, "18", False),
    ({"type": "integer", "exclusiveMinimum": -10, "maximum": 10, "multipleOf": 7}, "-7", True),
    ({"type": "integer", "exclusiveMinimum": -10, "maximum": 10, "multipleOf": 7}, "14", False),
    # $ref to a plain-name fragment: $anchor, or a draft 4-7 id "#name"
    ({"$schema": "http://json-schema.org/draft-04/schema#", "definitions": {"x": {"id": "#xid", "type": "integer"}},
      "properties": {"a": {"$ref": "#xid"}}}, '{"a":1}', True),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "definitions": {"x": {"id": "#xid", "type": "integer"}},
      "properties": {"a": {"$ref": "#xid"}}}, '{"a":"s"}', False),
    ({"$defs": {"y": {"$anchor": "yy", "type": "string"}}, "properties": {"b": {"$ref": "#yy"}}}, '{"b":2}', False),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"{i}:{json.dumps(CASES[i][0])[:40]}:{CASES[i][1][:20]}")
def test_keyword_semantics_bytes(case):
    schema, text, accepted = CASES[case]
    got, detail = walk(schema, text)
    assert got != "error", detail
    assert (got == "accepted") == accepted, (schema, text, got, detail)


@pytest.fixture(scope="module")
def qwen_checker():
    from _json_cases import Checker, VocabTokenizer
    vocab, eos = qwen_token_bytes()
    checker = Checker(VocabTokenizer(vocab, eos), json_wasm())
    yield checker
    checker.close()


def _by_schema(cases) -> list[tuple[object, list[tuple[str, bool]]]]:
    """CASES grouped by schema, in order: (schema, [(text, accepted), ...])."""
    groups: dict[str, tuple[object, list[tuple[str, bool]]]] = {}
    for schema, text, accepted in cases:
        groups.setdefault(json.dumps(schema, sort_keys=True), (schema, []))[1].append((text, accepted))
    return list(groups.values())


QWEN_GROUPS = _by_schema(CASES)
# make test's share: every other schema whose texts are short. The long-string cases (hundreds of
# tokens, each step a mask over 151k tokens: 20-200 s at load 20) and the rest run in make test-slow.
QWEN_QUICK = [g for g in QWEN_GROUPS if max(len(text) for text, _ in g[1]) <= 64][::2]


def _check_qwen(checker, groups) -> int:
    """Each schema compiled once (the first call over 151k tokens is the cost), each of its texts
    walked on a fork of it. Returns the texts checked."""
    checked = 0
    for schema, texts in groups:
        handle, err, _ = checker.open(schema)
        try:
            assert err is None, (schema, err)
            for text, accepted in texts:
                ok, _ = checker.accepts(handle, text.encode())
                assert ok == accepted, (schema, text)
                checked += 1
        finally:
            checker.close_handle(handle)
    return checked


def test_keyword_semantics_qwen(qwen_checker):
    """The same cases with Qwen2's tokens (multi-byte tokens cross keys, quotes and values):
    QWEN_QUICK here; every case in test_keyword_semantics_qwen_all (`make test-slow`: all of them
    took 145 s of `make test` at load 8)."""
    assert _check_qwen(qwen_checker, QWEN_QUICK) == sum(len(texts) for _, texts in QWEN_QUICK)


@pytest.mark.slow
def test_keyword_semantics_qwen_all(qwen_checker):
    assert _check_qwen(qwen_checker, QWEN_GROUPS) == len(CASES)


# Keyword combinations beyond the plain ones: documents sampled under their masks (random logits)
# validate with `jsonschema`.
COMBINATIONS = [
    {"type": "object", "properties": {"p": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 1.5},
                                      "q": {"type": "number", "exclusiveMinimum": -0.25, "multipleOf": 0.01}},
     "required": ["p", "q"], "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "format": "email", "maxLength": 40}, "minItems": 1},
    {"type": "object", "properties": {"u": {"type": "string", "pattern": "^https?://.+$", "maxLength": 60},
                                      "z": {"type": "string", "pattern": "[0-9]{3}", "minLength": 3, "maxLength": 8}},
     "required": ["u", "z"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -20, "maximum": 50, "multipleOf": 6}},
]


def test_sampled_documents_of_keyword_combinations_validate(qwen_checker):
    from _json_cases import sampled_documents_validate
    cases = [{"id": f"combination {i}", "schema": s} for i, s in enumerate(COMBINATIONS)]
    assert sampled_documents_validate(qwen_checker, cases, per_schema=2) == 2 * len(cases)


@pytest.mark.slow
def test_sampled_long_strings_validate(qwen_checker):
    """Past 128 characters (the chain of string machines): masks there take milliseconds."""
    from _json_cases import sampled_documents_validate
    schemas = [{"type": "object", "properties": {"body": {"type": "string", "minLength": 270, "maxLength": 32767}},
                "required": ["body"], "additionalProperties": False},
               {"type": "array", "items": {"type": "string", "maxLength": 5000}, "maxItems": 3}]
    cases = [{"id": f"long {i}", "schema": s} for i, s in enumerate(schemas)]
    assert sampled_documents_validate(qwen_checker, cases, per_schema=2, max_tokens=1500) >= len(cases)


@pytest.mark.parametrize("schema", [
    {"type": "number", "minimum": 0.5, "exclusiveMaximum": 1.5},
    {"type": "number", "exclusiveMinimum": -1.5, "maximum": -0.05},
    {"type": "number", "minimum": -0.5, "maximum": 0.25},
    {"type": "number", "minimum": 1.25, "maximum": 1.25},
    {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5, "multipleOf": 0.1},
    {"type": "number", "minimum": 1e-3, "maximum": 12.5e1},
])
def test_number_bounds_agree_with_decimal_comparison(qwen_checker, schema):
    """Every candidate near the bounds is accepted exactly when it is valid (as Decimal compares;
    `-0` and exponent forms are the narrowing: never offered under bounds)."""
    from decimal import Decimal
    bounds = [Decimal(str(schema[k])) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema]
    texts = {"0", "1", "-1", "0.5", "2", "100"}
    for b in bounds:
        for delta in ("0", "0.1", "0.01", "0.001", "1"):
            for x in (b + Decimal(delta), b - Decimal(delta)):
                texts |= {f"{x:f}", f"{x:f}0", f"{x:f}.0" if "." not in f"{x:f}" else f"{x:f}"}

    def valid(d):
        return ((d >= Decimal(str(schema["minimum"]))) if "minimum" in schema else True) and \
            ((d <= Decimal(str(schema["maximum"]))) if "maximum" in schema else True) and \
            ((d > Decimal(str(schema["exclusiveMinimum"]))) if "exclusiveMinimum" in schema else True) and \
            ((d < Decimal(str(schema["exclusiveMaximum"]))) if "exclusiveMaximum" in schema else True) and \
            (d % Decimal(str(schema["multipleOf"])) == 0 if "multipleOf" in schema else True)
    handle, err, _ = qwen_checker.open(schema)
    try:
        assert err is None, err
        for text in sorted(texts):
            if text.startswith("-0") and Decimal(text) == 0:
                continue
            ok, _ = qwen_checker.accepts(handle, text.encode())
            assert ok == valid(Decimal(text)), (schema, text)
    finally:
        qwen_checker.close_handle(handle)


@pytest.mark.parametrize("schema, message", [
    ({"not": {"type": "string", "pattern": "^a"}}, "unsupported: not at #"),
    ({"properties": {"a": {"if": {"type": "string"}}}}, "unsupported: if at #/properties/a"),
    ({"items": {"uniqueItems": True}, "type": "array"}, "unsupported: uniqueItems at #/items"),
    ({"oneOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]}, "unsupported: oneOf at #"),
    ({"type": "string", "format": "hostname-idn"}, "unsupported: format at #/format (hostname-idn)"),
    ({"type": "string", "pattern": "(?=a)b"}, "unsupported: pattern at #/pattern (lookaround assertions)"),
    ({"$defs": {"a": {"dependentRequired": {"x": ["y"]}}}, "$ref": "#/$defs/a"}, "unsupported: dependentRequired at #/$defs/a"),
    ({"type": "integer", "multipleOf": 3}, "unsupported: multipleOf at #"),
    ({"$ref": "other.json#/a"}, "unsupported: $ref at #"),
    ({"type": "integer", "minimum": 0, "multipleOf": 12}, "unsupported: multipleOf at #"),
])
def test_unsupported_keywords_are_errors_naming_keyword_and_pointer(schema, message):
    h, br = session(schema)
    assert br == []
    assert any(line.startswith("json: " + message) for line in h.logs), h.logs


def test_a_schema_that_admits_nothing_is_reported():
    for schema in (False, {"type": "integer", "minimum": 3, "maximum": 2}, {"allOf": [{"type": "string"}, {"type": "null"}]}):
        h, br = session(schema)
        assert br == [] and "json: the schema admits no document" in "".join(h.logs), (schema, h.logs)


@pytest.mark.parametrize("arg", [b"{not json", b'{"type": "integer"} trailing'])
def test_bad_json_is_reported(arg):
    h, br = session(arg)
    assert br == [] and "json: bad schema: not JSON" in "".join(h.logs)


def test_ignore_option_relaxes_and_says_so():
    schema = {"type": "object", "properties": {"d": {"type": "string", "format": "hostname-idn"}}}
    for options in (b"\0fast_forward=0\0ignore=format", None):
        s = dict(schema, **({"x-aicirt": {"ignore": ["format"], "fast_forward": False}} if options is None else {}))
        h, br = session(s, options or b"")
        assert br, h.logs
        assert any("not enforcing format at #/properties/d (option ignore)" in line for line in h.logs), h.logs


def test_coerce_one_of_option():
    schema = {"oneOf": [{"type": "string"}, {"pattern": "^x"}]}   # no complement of a pattern is written
    assert walk(schema, '"x"')[0] == "error"
    assert walk(schema, '"x"', options=b"\0fast_forward=0\0coerce_one_of")[0] == "accepted"


def test_whitespace_is_compact_by_default_and_bounded_on_request():
    assert walk(OBJ, '{ "b":"x"}')[0] == "rejected"
    opts = b"\0fast_forward=0\0whitespace=2"
    assert walk(OBJ, '{ "b" :  "x"\n}', options=opts)[0] == "accepted"
    assert walk(OBJ, '{   "b":"x"}', options=opts)[0] == "rejected"     # at most 2 in a row


def test_unknown_option_is_an_error():
    h, br = session(OBJ, b"\0whitespaces=2")
    assert br == [] and "json: unknown option whitespaces=2" in "".join(h.logs)


def test_stops_when_the_document_is_complete():
    h, br = session({"type": "boolean"})
    for t in b"tru":
        br = h.step([t], sampled=t)
    assert br and br[0].allowed() == {ord("e")}
    assert h.step([ord("e")], sampled=ord("e")) == []     # complete and nothing can follow


# -- fast-forward: forced text arrives as canonical tokens, minus the open final token ---------
def test_fast_forward_of_forced_text():
    vocab, eos = qwen_token_bytes()
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    encode = lambda s: greedy_tokenize(vocab, s.encode())
    h, br = session(schema, b"", vocab, eos, encode)
    # at the start `{"name":"` is forced: fast-forwarded without sampling
    assert len(br) == 1 and br[0].mask is None and len(br[0].splices) == 1
    _, bt, ff = br[0].splices[0]
    text = b"".join(vocab[t] for t in ff)
    assert bt == 0 and b'{"name":"'.startswith(text) and len(text) >= 2
    br = h.step(ff)
    assert br[0].mask is not None   # the rest of the forced text is sampled under the mask
    forced_rest = b'{"name":"'[len(text):]
    allowed = br[0].allowed()
    assert any(vocab[t] == forced_rest for t in allowed) or any(vocab[t].startswith(forced_rest) for t in allowed)


def test_fast_forward_heals_the_last_token():
    vocab, eos = qwen_token_bytes()
    schema = {"type": "object", "properties": {"x": {"type": "boolean"}, "yy": {"const": "constant text"}},
              "required": ["x", "yy"], "additionalProperties": False}
    encode = lambda s: greedy_tokenize(vocab, s.encode())
    h, br = session(schema, b"", vocab, eos, encode)
    fed = []
    while br and br[0].mask is None:               # forced prefix
        _, bt, ff = br[0].splices[0]
        fed = fed[:len(fed) - bt] + ff
        br = h.step(ff, backtrack=bt)
    text = b"".join(vocab[t] for t in fed)
    assert b'{"x":'.startswith(text) or text.startswith(b'{"x"')
    # sample the rest of the prefix, then `true`: the next key and the const are forced
    for b_ in (b'{"x":'[len(text):] + b"true").decode():
        t = vocab.index(b_.encode())
        fed.append(t)
        br = h.step([t], sampled=t)
    assert br and br[0].mask is None
    _, bt, ff = br[0].splices[0]
    healed = fed[:len(fed) - bt] + ff
    out = b"".join(vocab[t] for t in healed)
    assert out.startswith(b'{"x":true') and b'{"x":true,"yy":"constant text"}'.startswith(out) and len(out) > len(b'{"x":true,')
    assert all(greedy_tokenize(vocab, vocab[t]) == [t] for t in ff)
