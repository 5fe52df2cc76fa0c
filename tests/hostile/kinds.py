"""The hostile suite: each kind is a controller written to misbehave in one way (WAT in wat.py,
C in hostile.c), what the runtime must make of it, and which part of issue 10 / docs/protocol.md it covers.

`expect`: "error: <needle>|<needle>" (the hostile sequence ends with an error naming the fault),
"legal" (it may run or stop, but not fail), "any" (only its neighbours matter), "load: <needle>" (refused by
`Runtime.load` with that message), "spawn: <needle>" (refused when a request spawns it).
`not_held_up`: the healthy sequences must finish while a hostile call is still out (a stuck call
never delays another sequence: checked by the order of events, so a busy machine cannot fail it).
`cpu_s`: the batch may use at most this much CPU time in this process, all threads (the host's work
on a hostile result is bounded: CPU time, which other processes on the machine do not inflate);
with `wait_hostile`, the span covers the hostile sequence's own end too (its limits hold).
`within_s`: the wall-clock time the batch takes on an idle machine: a latency figure that
bench/fuzz_rate.py reports ("too slow"), never asserted by a test (a busy machine stretches it).
`xfail`: the reason, when a core bug of issue 10 items 1-2 still breaks the case.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aicirt import Capabilities
from hostile import wat
from hostile.wat import module, no_mask, splice, store

HERE = Path(__file__).resolve().parent
ALL = Capabilities.ALL


@dataclass(frozen=True)
class Kind:
    name: str
    covers: str                     # issue 10 item or protocol section (docs/protocol.md anchor)
    expect: str
    wasm: object = None             # bytes (WAT) or None for hostile.c
    arg: bytes = b""
    capabilities: Capabilities = ALL
    copies: int = 1
    respawn: int = 0
    wait_hostile: bool = False      # run (and count cpu_s) until the hostile sequence has ended too
    take_var_changes: bool = True   # False: the engine never takes variable changes (they pile up)
    settle: bool = False            # after the healthy finish, step on until the hostile ends (to see its error)
    not_held_up: bool = False       # the healthy finish while a hostile call is still out
    cpu_s: float | None = None      # CPU seconds the batch may use in this process
    within_s: float | None = None   # wall-clock on an idle machine: bench/fuzz_rate.py only
    limits: dict = field(default_factory=dict)
    xfail: str | None = None


def c(mode: str, **kw) -> dict:
    return {"wasm": None, "arg": mode.encode(), **kw}


DEFAULT_HARD_LIMIT = {"call_timeout_s": 1.0, "first_call_timeout_s": 1.0}   # docs/protocol.md#limits: 40 soft deadlines
STUCK = "time limit|late 10 steps"    # docs/protocol.md#limits: either hard limit may end a stuck controller

KINDS = [
    # -- time: isolation (issue 10 item 1, docs/protocol.md#limits) ---------------------------------------------
    Kind("loop-every-call", "item 1, protocol.md#limits hard limit", "error: " + STUCK, module(wat.loop_forever())),
    Kind("loop-first-call", "item 1, protocol.md#limits first call", "error: time limit",
         module("(if (i32.gt_u (local.get $tn) (i32.const 0)) (then (loop $l (br $l))))")),
    # settle: the limits count CPU time (docs/protocol.md#limits), so on a busy machine a looper may end a few
    # steps after the healthy sequences have finished
    Kind("four-looping-requests", "item 1", "error: " + STUCK, module(wat.loop_forever()), copies=4,
         limits=DEFAULT_HARD_LIMIT, settle=True),
    Kind("fork-then-both-loop", "item 1", "error: " + STUCK,
         module("(if (i32.gt_u (local.get $gn) (i32.const 0)) (then (loop $l (br $l))))"
                "(if (i32.gt_u (local.get $tn) (i32.const 0)) (then "
                + store(1024, 1040) + store(1028, 2) + r"(memory.copy (i32.const 1068) (i32.const 1040) (i32.const 28))))"),
         limits=DEFAULT_HARD_LIMIT, settle=True),
    Kind("slow-first-call-every-step", "item 1", "any",
         module("(if (i32.gt_u (local.get $tn) (i32.const 0)) (then " + wat.spin(150_000_000) + "))"),
         respawn=12, limits={**DEFAULT_HARD_LIMIT, "soft_deadline_s": 0.025}, not_held_up=True,
         within_s=1.0),
    Kind("loop-in-initialize", "item 1", "error: _initialize", module(initialize=wat.loop_forever()),
         not_held_up=True, within_s=1.0, settle=True, limits={"first_call_timeout_s": 2.0, "soft_deadline_s": 0.025}),
    Kind("spin-just-past-soft-deadline", "item 1, protocol.md#limits soft deadline", "legal", **c("spin-every-call:40")),
    Kind("loop-in-post-return", "item 1 post-return", "error: cabi_post_mid-process",
         module(splice(ff=(66,)), post=wat.loop_forever()), not_held_up=True, within_s=0.8, settle=True,
         limits={**DEFAULT_HARD_LIMIT, "soft_deadline_s": 0.025}),
    # -- results: docs/protocol.md#semantics invalid results ---------------------------------------------------------
    Kind("trap-unreachable", "protocol.md#semantics trap", "error: unreachable", module("unreachable")),
    Kind("divide-by-zero", "protocol.md#semantics trap", "error: divide by zero",
         module("(drop (i32.div_u (i32.const 1) (i32.sub (local.get $tn) (local.get $tn))))")),
    Kind("out-of-bounds-load", "protocol.md#semantics trap", "error: out of bounds", module("(drop (i32.load (i32.const -4)))")),
    Kind("null-indirect-call", "protocol.md#semantics trap", "error: uninitialized element",
         module("(drop (call_indirect (type $nullary) (i32.const 0)))")),
    Kind("stack-overflow", "protocol.md#limits stack", "error: stack",
         module("", extra='(func $r (param i32) (result i32) (call $r (i32.add (local.get 0) (i32.const 1))))',
                ret="(drop (call $r (i32.const 0))) (i32.const 1024)")),
    Kind("result-pointer-out-of-bounds", "protocol.md#semantics bad pointer", "error: outside linear memory", module(ret="(i32.const -8)")),
    Kind("branch-list-out-of-bounds", "protocol.md#semantics bad pointer", "error: outside linear memory", module(store(1024, -100))),
    Kind("mask-pointer-out-of-bounds", "protocol.md#semantics bad pointer", "error: outside linear memory", module(store(1044, -16))),
    Kind("mask-wrong-length", "protocol.md#semantics mask length", "error: mask has 3 words", module(store(1048, 3))),
    Kind("mask-empty", "protocol.md#semantics empty mask", "error: mask allows no token", module(store(2056, 0))),
    Kind("mask-bit-past-vocab", "protocol.md#semantics token >= vocab", "error: mask allows token 257", module(store(2080, 2))),
    Kind("ff-token-past-vocab", "protocol.md#semantics token >= vocab", "error: token id 300 >= vocab size 257",
         module(splice(ff=(300,)))),
    Kind("when-sampled-past-vocab", "protocol.md#semantics token >= vocab", "error: token id 999", module(splice(when=(999,), ff=(1,)))),
    Kind("backtrack-past-start", "protocol.md#semantics backtrack", "error: reaches past the start", module(splice(backtrack=1000))),
    Kind("fork-without-capability", "protocol.md#semantics capabilities", "error: capability `fork`",
         module(store(1028, 2) + "(memory.copy (i32.const 1068) (i32.const 1040) (i32.const 28))"),
         capabilities=ALL & ~Capabilities.FORK),
    Kind("backtrack-without-capability", "protocol.md#semantics capabilities", "error: capability `backtrack`",
         module(splice(backtrack=1)), capabilities=ALL & ~Capabilities.BACKTRACK),
    Kind("ff-without-capability", "protocol.md#semantics capabilities", "error: capability `ff-tokens`",
         module(splice(ff=(66,))), capabilities=ALL & ~Capabilities.FF_TOKENS),
    Kind("conditional-without-capability", "protocol.md#semantics capabilities", "error: capability `conditional-ff-tokens`",
         module(splice(when=(65,), ff=(66,))), capabilities=ALL & ~Capabilities.CONDITIONAL_FF_TOKENS),
    Kind("too-many-forks-at-once", "protocol.md#semantics/#limits forks", "error: limit of 16 forks",
         module(store(1024, 8192) + store(1028, 17)
                + "(block $d (loop $l (br_if $d (i32.ge_u (global.get $heap) (i32.const 65553)))"
                  "(memory.copy (i32.add (i32.const 8192) (i32.mul (i32.sub (global.get $heap) (i32.const 65536)) (i32.const 28)))"
                  " (i32.const 1040) (i32.const 28))"
                  "(global.set $heap (i32.add (global.get $heap) (i32.const 1))) (br $l)))")),
    Kind("fork-bomb", "protocol.md#limits forks", "error: limit of 16 forks", **c("fork-bomb")),
    Kind("two-billion-branches", "protocol.md#semantics bad pointer", "error: outside linear memory", module(store(1028, 0x7FFFFFFF))),
    Kind("temperature-nan", "protocol.md#semantics invalid result", "error: temperature", module(store(1052, 1) + store(1056, 0x7FC00000))),
    Kind("temperature-negative", "protocol.md#semantics invalid result", "error: temperature",
         module(store(1052, 1) + store(1056, 0xBF800000))),
    Kind("no-mask-no-splice", "protocol.md#semantics invalid result", "error: exactly one unconditional splice", module(no_mask())),
    Kind("no-mask-conditional-splice", "protocol.md#semantics invalid result", "error: exactly one unconditional splice",
         module(no_mask() + splice(when=(65,), ff=(66,)))),
    Kind("100k-splices", "item 1 bounded results", "error: Limits.max_splices", cpu_s=1.0, within_s=1.0,
         wasm=module(store(1060, 4 << 20) + store(1064, 100_000), memory="200", once=True)),
    Kind("aliased-when-sampled-lists", "item 1 bounded results", "error: Limits.max_result_tokens", cpu_s=1.0, within_s=1.0,
         wasm=module("(block $d (loop $l (br_if $d (i32.ge_u (global.get $heap) (i32.const 65586)))"
                     "(i32.store (i32.add (i32.const 4194304) (i32.mul (i32.sub (global.get $heap) (i32.const 65536)) (i32.const 20)))"
                     " (i32.const 131072))"
                     "(i32.store offset=4 (i32.add (i32.const 4194304) (i32.mul (i32.sub (global.get $heap) (i32.const 65536)) (i32.const 20)))"
                     " (i32.const 100000))"
                     "(global.set $heap (i32.add (global.get $heap) (i32.const 1))) (br $l)))"
                     + store(1060, 4194304) + store(1064, 50), memory="80", once=True)),
    # -- allocation and memory (docs/protocol.md#limits, issue 10 item 3 messages) --------------------------------
    Kind("trap-in-realloc", "item 3: message says where", "error: cabi_realloc",
         module(realloc='(func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) unreachable)')),
    Kind("realloc-out-of-bounds", "protocol.md#semantics bad pointer", "error: misaligned or outside linear memory",
         module(realloc='(func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const -16))')),
    Kind("realloc-misaligned", "item 3", "error: misaligned",
         module(realloc='(func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 70001))')),
    Kind("trap-in-post-return", "item 3: message says where", "error: cabi_post_mid-process",
         module(splice(ff=(66,)), post="unreachable")),
    Kind("grow-past-memory-limit", "protocol.md#limits memory", "error: unreachable", **c("malloc-until-fail")),
    Kind("touch-most-of-memory-every-call", "protocol.md#limits memory (legal)", "legal", **c("touch-all-memory")),
    # -- host imports (docs/protocol.md#wit, issue 10 item 1 host work) ----------------------------------------
    Kind("log-bad-pointer", "protocol.md#wit host import bounds", "error: host import `log`: range",
         module("(call $log (i32.const -16) (i32.const 100))", imports=("log",))),
    Kind("var-name-not-utf8", "protocol.md#wit host import", "error: not valid UTF-8",
         module(store(4000, 0xFFFEFDFC) + "(call $var-set (i32.const 4000) (i32.const 4) (i32.const 0) (i32.const 0))",
                imports=("var-set",))),
    Kind("tokenize-over-arg-limit", "protocol.md#wit host import limit", "error: over the limit", **c("tokenize-huge")),
    Kind("detokenize-bad-id", "protocol.md#wit host import", "error: token id 1000000", **c("detokenize-bad-id")),
    # appends copy the whole value each time, so the call may hit its time limit first
    Kind("variable-flood", "protocol.md#limits variables", "error: Limits.variable_bytes|time limit", **c("var-flood")),
    # changes not taken are coalesced per name (host.c), so empty appends pile up nothing: legal
    Kind("empty-var-append-flood", "item 1 host work", "legal",
         take_var_changes=False, limits={"variable_bytes": 64 << 10}, **c("empty-append-flood:2000"),
         ),
    Kind("two-fd-writes-of-65535-iovecs", "item 1 host work", "error: over the limit of 1024|" + STUCK, cpu_s=0.6, within_s=0.6,
         copies=2,
         wasm=module("(block $d (loop $l (br_if $d (i32.ge_u (global.get $heap) (i32.const 131071)))"
                     "(i64.store (i32.add (i32.const 262144) (i32.shl (i32.sub (global.get $heap) (i32.const 65536))"
                     " (i32.const 3))) (i64.const 0x0002000000000000))"
                     "(global.set $heap (i32.add (global.get $heap) (i32.const 1))) (br $l)))"
                     "(drop (call $fd_write (i32.const 1) (i32.const 262144) (i32.const 65535) (i32.const 4096)))",
                     wasi=("fd_write",), memory="16"),
         ),
    Kind("proc-exit", "protocol.md#wit WASI shim", "error: proc_exit(3)", module("(call $proc_exit (i32.const 3))", wasi=("proc_exit",))),
    Kind("log-flood", "protocol.md#limits log cap (legal)", "legal", **c("log-flood")),
    Kind("token-trie-every-call", "protocol.md#wit host import (legal)", "legal", **c("trie-every-call")),
    Kind("stop-at-once", "protocol.md#semantics stop (legal)", "legal", **c("stop-at-once")),
    Kind("noop-forever", "protocol.md#semantics no-op (legal)", "legal", **c("noop-forever")),
    Kind("global-get-data-offset", "item 3 instantiation", "legal",
         module(extra='(global $b i32 (i32.const 4096)) (data (global.get $b) "x")')),
    Kind("extended-const-global", "item 3 instantiation", "legal",
         module(extra="(global $c i32 (i32.add (i32.const 1) (i32.const 2)))")),
    Kind("passive-element-expressions", "item 3 instantiation", "legal",
         module(extra="(func $f) (elem $e func $f)")),
    # -- refused before it runs (issue 10 item 3) -------------------------------------------------
    Kind("start-function", "item 3 loader", "load: has a start function",
         module(extra="(func $s) (start $s)")),
    Kind("initial-memory-over-limit", "item 3 loader", "load: over the memory limit", module(memory="2000")),
    Kind("shared-memory", "item 3 loader", "load: is shared", module(memory="2 2 shared")),
    Kind("table-mutated-fork-unsafe", "item 3 fork safety", "load: uses `table.set`",
         module("(table.set 0 (i32.const 0) (ref.null func))")),
    Kind("data-dropped-fork-unsafe", "item 3 fork safety", "load: uses `data.drop`",
         module("(data.drop $p)", extra='(data $p "xy")')),
]
