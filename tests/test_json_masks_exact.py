"""The `json` controller's fast mask paths (cached masks kept as diffs, the free-string and
short-token slices, character counts in bounded strings, string probes over byte classes) give
the same masks, bit for bit, as plain walks of the whole trie (the option `reference_masks`),
at every step of documents written token by token with Qwen2's vocabulary; and the DFA states
built ahead in aicirt_prepare (the option `warm`, on by default) change no mask, in the request
that prepared nor in those started from its template.

The default run covers hand-written schemas aimed at each path; `-m slow` adds a sample of the
MaskBench cases (every instance, valid or not, up to the token where it is rejected).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from _json_cases import SLICES, Checker, VocabTokenizer, instance_text, sample
from _vocabs import qwen_token_bytes
from aicirt.build.toolchain import build_cached

STR = {"type": "string"}
CASES = [
    (STR, ['"hello world, this is a long free string with ünïcödé and 漢字 in it"']),
    ({"type": "string", "pattern": "^[ -\u007f]*$"}, ['"printable ASCII only, no more"']),
    ({"type": "string", "maxLength": 10}, ['"abcdefghij"', '"ab"', '""', '"é漢x"']),
    ({"type": "string", "minLength": 3, "maxLength": 40},
     ['"a string of some thirty-nine characters"', '"abc"']),
    ({"type": "string", "minLength": 20, "maxLength": 255}, ['"' + "word " * 30 + '"']),
    ({"type": "object", "properties": {k: {"type": "integer"} for k in
                                       ["all", "currentconn", "expirytime", "logintime", "numofconnections",
                                        "sid", "username", "lastactivitytime"]}},
     ['{"all":1,"sid":2,"other_key_here":"x","another":[1,2]}', '{"expirytime":5}']),
    ({"type": "object", "patternProperties": {"^.{1,255}$": {}}}, ['{"key1":"value","k":{"a":null}}']),
    ({"type": "object", "properties": {"email": {"type": "string", "format": "email"}}, "required": ["email"],
      "additionalProperties": False}, ['{"email":"john.doe@example.com"}']),
    ({"type": "array", "items": {"type": "string", "maxLength": 5}}, ['["abcde","","xy","12345"]']),
    # key languages as machines (keylang.c): a pattern less the listed keys, and no pattern at all
    ({"type": "object", "properties": {"id": STR}, "patternProperties": {"^x-": {"type": "integer"}},
      "required": ["x-req"]}, ['{"id":"a","x-req":1,"x-other":2,"plain key é":[1],"idd":null}']),
    # any_order: machines made on first entry, one a key set (anyorder.c)
    ({"x-aicirt": {"any_order": True}, "type": "object",
      "properties": {"name": STR, "namespace": STR, "labels": {"type": "object"}, "uid": STR}, "required": ["uid"]},
     ['{"namespace":"default","uid":"1","extra":3,"name":"web","labels":{"app":"x"}}']),
    # length-counted machines (lencount.c): a pattern or format beside bounds it does not imply,
    # long plain strings; near the bounds and far from them (settled masks cached across counts)
    ({"type": "string", "pattern": "ab", "maxLength": 255}, ['"' + "zé " * 40 + 'ab' + "x" * 120 + '"', '"ab"']),
    ({"type": "string", "pattern": "^[A-Za-z0-9]+(-[A-Za-z0-9]+)*$", "maxLength": 50},
     ['"example-org"', '"' + "-".join(["abcdefg"] * 6) + 'ab"']),
    ({"type": "string", "format": "email", "minLength": 8, "maxLength": 40}, ['"john.doe@example.com"']),
    ({"type": "string", "minLength": 300, "maxLength": 1000}, ['"' + "word, " * 60 + '"']),
    ({"type": "string", "pattern": "^(ab|c)*$", "minLength": 5, "maxLength": 9}, ['"abcab"', '"ccccccccc"']),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "pattern": "b", "maxLength": 30}},
                                       "n": {"type": "integer"}}},
     ['{"a":["ab","a long one: b","xb"],"n":1}']),
    ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                       "tags": {"type": "array", "items": STR}},
      "required": ["name"]}, ['{"name":"Alice Liddell","tags":["a","b c"]}']),
]


@pytest.fixture(scope="module")
def pair():
    vocab, eos = qwen_token_bytes()
    tok = VocabTokenizer(vocab, eos)
    wasm = build_cached("json").read_bytes()
    fast, ref = Checker(tok, wasm), Checker(tok, wasm, options=b"\0fast_forward=0\0reference_masks")
    yield tok, fast, ref
    fast.close()
    ref.close()


@pytest.fixture(scope="module")
def cold(pair):
    tok, _, _ = pair
    checker = Checker(tok, build_cached("json").read_bytes(), options=b"\0fast_forward=0\0warm=0")
    yield checker
    checker.close()


def masks_along(checker: Checker, schema, toks: list[int]) -> list[np.ndarray]:
    """The masks before each token, and after the last unless the controller stopped there (a
    complete document); stops early where a token is not allowed."""
    handle, err, _ = checker.open(schema)
    assert err is None, err
    req, seq = handle
    child = seq.fork()
    out = []
    try:
        r, mask = checker._submit(child, [], None, record=False)
        for k, t in enumerate(toks + [None]):
            if not r.branches or mask is None:
                break
            out.append(np.array(mask, copy=True))
            if t is None or not (int(mask[t >> 5]) >> (t & 31)) & 1:
                break
            r, mask = checker._submit(child, toks[:k + 1], t, record=False)
    finally:
        child.close()
        checker.close_handle(handle)
    return out


def _same(pair, schema, text: bytes, must_accept: bool):
    tok, fast, ref = pair
    toks = tok.encode_bytes(text)
    a, b = masks_along(fast, schema, toks), masks_along(ref, schema, toks)
    assert len(a) == len(b), (text, len(a), len(b))
    for k, (x, y) in enumerate(zip(a, b)):
        if not np.array_equal(x, y):
            diff = np.nonzero(np.unpackbits((x ^ y).view(np.uint8), bitorder="little"))[0][:5]
            pytest.fail(f"{json.dumps(schema)[:80]} {text[:40]!r}: masks differ before token {k}, "
                        f"tokens {[(int(t), tok.token_bytes[t]) for t in diff]}")
    if must_accept:
        allowed = all((int(m[t >> 5]) >> (t & 31)) & 1 for m, t in zip(a, toks))
        assert len(a) >= len(toks) and allowed, (text, "rejected at token", len(a) - 1)


@pytest.mark.parametrize("schema,docs", CASES, ids=[json.dumps(c[0])[:40] for c in CASES])
def test_fast_masks_are_reference_masks(pair, schema, docs):
    for doc in docs:
        _same(pair, schema, doc.encode("utf-8"), must_accept=True)


@pytest.mark.slow
@pytest.mark.parametrize("slice_name", SLICES)
def test_fast_masks_are_reference_masks_maskbench(pair, slice_name):
    tok, fast, _ = pair
    for case in sample(slice_name, 12, seed=2):
        handle, err, _ = fast.open(case["schema"])
        fast.close_handle(handle)
        if err is not None:
            continue
        for t in case["tests"]:
            try:
                text = instance_text(case["schema"], t["data"])
            except (ValueError, RecursionError):
                continue
            _same(pair, case["schema"], text, must_accept=False)


def _differ(tok, schema, text, a, b) -> str | None:
    if len(a) != len(b):
        return f"{text[:40]!r}: {len(a)} masks against {len(b)}"
    for k, (x, y) in enumerate(zip(a, b)):
        if not np.array_equal(x, y):
            diff = np.nonzero(np.unpackbits((x ^ y).view(np.uint8), bitorder="little"))[0][:5]
            return f"{text[:40]!r}: masks differ before token {k}, tokens {[tok.token_bytes[t] for t in diff]}"
    return None


@pytest.mark.parametrize("schema,docs", CASES, ids=[json.dumps(c[0])[:40] for c in CASES])
def test_warmed_masks_are_cold_masks(pair, cold, schema, docs):
    """Three requests of the same argument (the second makes the template, the third starts from
    it, Limits.prepared_after, where the template is worth keeping), each beside the same
    request with warm=0."""
    tok, fast, _ = pair
    for doc in docs:
        toks = tok.encode_bytes(doc.encode("utf-8"))
        ref = masks_along(cold, schema, toks)
        assert ref, doc
        for _ in range(3):
            err = _differ(tok, schema, doc.encode("utf-8"), masks_along(fast, schema, toks), ref)
            assert err is None, f"{json.dumps(schema)[:80]} {err}"


def test_warm_option_bounds_the_states(pair):
    """warm=N is an option like the others (an unknown value is no error: parse_uint), and a
    schema whose machines hold more states than the budget still gives the reference masks."""
    tok, _, ref = pair
    schema = {"type": "object", "properties": {f"key_number_{i}": {"type": "string", "pattern": "^[a-f0-9]{8}$"}
                                               for i in range(40)}}
    doc = json.dumps({"key_number_3": "0123abcd", "key_number_17": "deadbeef"}, separators=(",", ":")).encode()
    toks = tok.encode_bytes(doc)
    want = masks_along(ref, schema, toks)
    for budget in (b"1", b"37", b"100000"):
        c = Checker(tok, build_cached("json").read_bytes(), options=b"\0fast_forward=0\0warm=" + budget)
        try:
            for _ in range(3):
                err = _differ(tok, schema, doc, masks_along(c, schema, toks), want)
                assert err is None, f"warm={budget.decode()}: {err}"
        finally:
            c.close()
