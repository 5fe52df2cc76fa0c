"""aici.JsonSchema in the js controller (controllers/js/constraint.c, docs/js.md): the json
controller's schema compiler and matcher compiled into the js controller give, through
aici.Follower (controllers/js/examples/json.js), the same masks bit for bit as the json
controller itself (with fast_forward=0: the Follower samples every token) at every step of
documents written token by token with Qwen2's vocabulary; its errors and the API's contract."""
from __future__ import annotations

import json

import numpy as np
import pytest

from _json_cases import VocabTokenizer
from _vocabs import qwen_token_bytes
import aicirt
from aicirt import StepInput
from aicirt.build.toolchain import CONTROLLERS_DIR, build_cached

STR = {"type": "string"}
CASES = [
    ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                                       "tags": {"type": "array", "items": STR}}, "required": ["name"]},
     '{"name":"Alice Liddell","age":7,"tags":["a","b c"]}'),
    ({"anyOf": [{"type": "number", "minimum": -5, "maximum": 10.5}, {"enum": ["x", None, True]}]}, "-4.25"),
    ({"type": "array", "items": {"$ref": "#/$defs/node"}, "$defs": {"node": {
        "type": "object", "properties": {"v": {"type": "boolean"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}},
     '[{"v":true,"kids":[{"v":false}]},{}]'),
    ({"x-aicirt": {"any_order": True, "whitespace": 1}, "type": "object",
      "properties": {"id": STR, "n": {"type": "integer"}}, "required": ["id"]}, '{ "n": 3, "id": "q" }'),
]


@pytest.fixture(scope="module")
def rig():
    vocab, eos = qwen_token_bytes()
    tok = VocabTokenizer(vocab, eos)
    limits = aicirt.Limits(first_call_timeout_s=60.0, call_timeout_s=10.0, soft_deadline_s=10.0)
    rt = aicirt.Runtime(tok, limits=limits, workers=1)
    ctrls = {"json": rt.load(build_cached("json")), "js": rt.load(build_cached("js"))}
    yield tok, rt, ctrls
    rt.close()


def masks_along(rt, ctrl, arg: bytes, prompt: list[int], toks: list[int]):
    """(the mask before each token and after the last, or None where the controller stopped;
    the log)."""
    seq = rt.new_request(ctrl, arg=arg).spawn()
    out = []
    try:
        sampled = None
        for k in range(len(toks) + 1):
            res = rt.submit([StepInput(seq, prompt + toks[:k], sampled)]).wait(300.0)
            r = res.results[0]
            assert r.status == "ok", (r.error, seq.log)
            if not r.branches:
                out.append(None)
                break
            row = r.branches[0].mask_row
            assert row is not None and not r.branches[0].splices
            out.append(np.array(res.masks[row], copy=True))
            if k < len(toks):
                sampled = toks[k]
        return out, seq.log
    finally:
        seq.close()


@pytest.mark.parametrize("schema,doc", CASES, ids=["object", "anyof-number", "ref-tree", "any-order-ws"])
def test_js_json_masks_equal_json_controllers(rig, schema, doc):
    tok, rt, ctrls = rig
    text = json.dumps(schema).encode()
    prompt, toks = tok.encode("Answer: "), tok.encode(doc) + [tok.eos_token_id]
    c, _ = masks_along(rt, ctrls["json"], text + b"\0fast_forward=0", prompt, toks)
    js_src = (CONTROLLERS_DIR / "js" / "examples" / "json.js").read_bytes()
    j, log = masks_along(rt, ctrls["js"], js_src + b"\0" + text, prompt, toks)
    assert len(j) == len(c) and c[-1] is None and len(c) >= len(toks), log   # both stop at the end
    for k, (a, b) in enumerate(zip(c, j)):
        assert (a is None) == (b is None), k
        if a is not None:
            assert np.array_equal(a, b), f"mask {k} differs"
            assert k < len(toks) and (int(a[toks[k] >> 5]) >> (toks[k] & 31)) & 1   # the document's next token is allowed


SCRIPT = """
let s, follow;
function midProcess(arg) {
  if (arg.callIndex === 0) {
    s = new aici.JsonSchema({type: "array", items: {type: "integer"}}, {whitespace: 0});
    const st = s.start(), a = s.advance(st, aici.tokenize("[1,"));
    const m1 = s.mask(a), m0 = s.mask(st);         // m1 is replaced by the second mask()
    let stale = "no";
    try { m1.count(); } catch (e) { stale = e.message; }
    aici.log("states", st, a, s.advance(a, aici.tokenize("]")), "stale:", stale,
             "accepting", s.accepting(s.advance(a, aici.tokenize("2]"))), "kept", m0.copy().count() > 0);
    try { new aici.JsonSchema("{not json"); } catch (e) { aici.log(e.name + ": " + e.message); }
    try { new aici.JsonSchema({type: "string"}, {colour: 1}); } catch (e) { aici.log(e.message); }
    try { new aici.JsonSchema({type: "string", pattern: "(?<=a)b"}); } catch (e) { aici.log(e.message); }
    follow = new aici.Follower(s);
    const r = follow.step();
    aici.log("result", r.branches.length, r.branches[0].sampleMask.count() > 0, "state", follow.state);
    return r;
  }
  return aici.stop();
}
"""


def test_js_json_schema_api_and_errors(rig):
    tok, rt, ctrls = rig
    seq = rt.new_request(ctrls["js"], arg=SCRIPT.encode() + b"\0").spawn()
    r = rt.submit([StepInput(seq, tok.encode("Q: "), None)]).wait(300.0).results[0]
    log = seq.log.decode()
    seq.close()
    assert r.status == "ok" and r.branches, (r.error, log)
    lines = log.splitlines()
    states = lines[0].split()
    assert states[:4] == ["states", "1", states[2], "0"] and int(states[2]) > 1, lines[0]   # "[1,]" is dead
    assert "stale: this TokenSet was a JsonSchema's mask, replaced by a later mask()" in lines[0]
    assert lines[0].endswith("accepting true kept true"), lines[0]
    assert lines[1].startswith("SyntaxError: JsonSchema: the schema is not JSON"), lines[1]
    assert "option 'colour' is unknown" in lines[2], lines[2]
    assert lines[3] == "JsonSchema: unsupported: pattern at #/pattern (lookaround assertions)", lines[3]
    assert lines[4] == "result 1 true state 1", lines[4]
