"""JS variants of the hostile suite: scripts for the js controller (controllers/js) that misbehave
in one way each, and the cause their sequence's error must name (tests/test_js_hostile.py runs
each beside healthy sequences). `expect` as in kinds.py: "error: a|b" (an
error naming a or b) or "legal" (it may run or stop, but not fail)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class JsKind:
    name: str
    script: str
    expect: str
    limits: dict = field(default_factory=dict)   # over the suite's (e.g. more CPU for a bomb to fill memory)


TIME = "error: time limit"          # the CPU limit, or its wall-clock backstop on a busy machine
ROOM = {"call_timeout_s": 5.0, "first_call_timeout_s": 5.0}
JS_KINDS = [
    JsKind("infinite-loop", "function midProcess(a) { for (;;) {} }", TIME),
    JsKind("loop-after-first-call", "function midProcess(a) { if (a.callIndex > 1) for (;;) {} "
           "return aici.sample(new aici.TokenSet([65, 66])); }", TIME),
    JsKind("memory-bomb", "const keep = []; function midProcess(a) { for (;;) keep.push(new Array(1 << 20).fill(1.5)); }",
           "error: out of memory", ROOM),
    JsKind("memory-bomb-typed", "const keep = []; function midProcess(a) { for (;;) keep.push(new Float64Array(1 << 20)); }",
           "error: out of memory|RangeError", ROOM),
    JsKind("catches-oom-and-loops", "const keep = []; function midProcess(a) { for (;;) { try { keep.push(new Array(1 << 16)"
           ".fill(1.5)); } catch (e) { keep.length = 0; } } }", TIME),
    JsKind("deep-recursion", "function f(n) { return f(n + 1) + 1; } function midProcess(a) { return f(0); }",
           "error: Maximum call stack size exceeded|call stack exhausted"),
    JsKind("deep-recursion-in-json", "function midProcess(a) { let o = {}; for (let i = 0; i < 2e5; i++) o = {o}; "
           "return JSON.parse(JSON.stringify(o)); }", "error: Maximum call stack size exceeded|call stack exhausted|out of memory"),
    JsKind("huge-string", "function midProcess(a) { let s = 'x'; for (;;) s += s; }",
           "error: out of memory|string too long"),
    JsKind("huge-repeat", "function midProcess(a) { return 'x'.repeat(2 ** 30); }",
           "error: out of memory|string too long|invalid string length|invalid repeat count"),
    JsKind("huge-log", "function midProcess(a) { console.log('y'.repeat(1 << 22)); return aici.stop(); }", "legal"),
    JsKind("huge-tokenize", "function midProcess(a) { aici.tokenize('z'.repeat(1 << 21)); return aici.stop(); }",
           "error: over the limit"),
    JsKind("huge-var", "function midProcess(a) { for (;;) aici.varAppend('v', 'w'.repeat(1 << 19)); }",
           "error: Limits.variable_bytes|" + TIME[7:]),
    JsKind("wrong-shape-null", "function midProcess(a) { return null; }", "error: wrong shape"),
    JsKind("wrong-shape-branches", "function midProcess(a) { return {branches: 'all of them'}; }",
           "error: wrong shape: branches is not an array"),
    JsKind("wrong-shape-mask", "function midProcess(a) { return {branches: [{sampleMask: {words: [1]}}]}; }",
           "error: sampleMask is not an aici.TokenSet"),
    JsKind("empty-mask", "function midProcess(a) { return aici.sample(new aici.TokenSet()); }", "error: mask"),
    JsKind("too-many-forks", "function midProcess(a) { return {branches: Array.from({length: 64}, () => "
           "({sampleMask: new aici.TokenSet([65])}))}; }", "error: fork"),
    JsKind("throws-non-error", "function midProcess(a) { throw {toString() { return 'not an Error'; }}; }",
           "error: midProcess threw: not an Error"),
    JsKind("syntax-error", "function midProcess(a) { return ((( }", "error: SyntaxError"),
    JsKind("getter-throws", "function midProcess(a) { return {get branches() { throw new Error('sneaky'); }}; }",
           "error: sneaky"),
    JsKind("proxy-result", "function midProcess(a) { return new Proxy({}, {ownKeys() { for (;;) {} }}); }", TIME),
]
