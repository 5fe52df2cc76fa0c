"""Hostile controllers written in WAT: one valid controller skeleton, and the one thing each
kind does differently (statements run before `mid-process` returns, or a replaced function).

The skeleton's answer, for the 257-token ByteTokenizer: one branch sampling token 65 ('A').
Its records sit at fixed addresses so a kind can corrupt exactly one field:
  1024  return area: branch list ptr (1040), len (1)
  1040  branch: mask tag @1040, mask ptr @1044 (2048), mask len @1048 (9 words), temperature
        tag @1052, f32 @1056, splices ptr @1060, len @1064
  2048  mask (9 words; token 65 = word 2 bit 1)
  3072  a splice: when ptr @3072, len @3076, backtrack @3080, ff ptr @3084, len @3088
  3200  token lists for splices
"""
from __future__ import annotations

import functools

import wasmtime

HOST = "aici:controller/host@0.1.0"
HOST_SIGS = {
    "log": "(param i32 i32)", "var-set": "(param i32 i32 i32 i32)", "var-append": "(param i32 i32 i32 i32)",
    "var-get": "(param i32 i32 i32)", "tokenize": "(param i32 i32 i32)", "detokenize": "(param i32 i32 i32)",
    "arg": "(param i32)", "token-trie": "(param i32)", "vocab-size": "(result i32)",
}

WASI_SIGS = {"fd_write": "(param i32 i32 i32 i32) (result i32)", "proc_exit": "(param i32)"}

REALLOC = """
  (func $realloc (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (i32.and (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
                           (i32.sub (i32.const 0) (local.get 2))))
    (global.set $heap (i32.add (local.get $p) (local.get 3)))
    (if (i32.gt_u (global.get $heap) (i32.shl (memory.size) (i32.const 16)))
      (then (if (i32.eq (memory.grow (i32.add (i32.shr_u (i32.sub (global.get $heap) (i32.shl (memory.size) (i32.const 16)))
                                                         (i32.const 16)) (i32.const 1))) (i32.const -1))
              (then unreachable))))
    (local.get $p))
"""

DATA = r"""
  (data (i32.const 1024) "\10\04\00\00\01\00\00\00")
  (data (i32.const 1040) "\01\00\00\00\00\08\00\00\09\00\00\00")
  (data (i32.const 2056) "\02")
"""


def module(body: str = "", *, imports: tuple[str, ...] = (), wasi: tuple[str, ...] = (), realloc: str | None = None, post: str | None = None,
           initialize: str | None = None, extra: str = "", memory: str = "2", ret: str = "(i32.const 1024)",
           once: bool = False) -> bytes:
    """A controller whose `mid-process` runs `body` then returns `ret` (the valid answer).
    `once`: only the first call does so; later calls stop (an empty branch list at 1100)."""
    if once:
        body = "(if (global.get $calls) (then (return (i32.const 1100)))) (global.set $calls (i32.const 1))" + body
    imps = "".join(f'(import "{HOST}" "{n}" (func ${n} {HOST_SIGS[n]}))\n' for n in imports)
    imps += "".join(f'(import "wasi_snapshot_preview1" "{n}" (func ${n} {WASI_SIGS[n]}))\n' for n in wasi)
    parts = [imps, f'(memory (export "memory") {memory})', "(global $heap (mut i32) (i32.const 65536)) (global $calls (mut i32) (i32.const 0))",
             realloc if realloc is not None else REALLOC, DATA,
             "(table 4 funcref) (type $nullary (func (result i32)))",
             '(func (export "mid-process") (param $bt i32) (param $tp i32) (param $tn i32) (param $ss i32)'
             ' (param $s i32) (param $gp i32) (param $gn i32) (result i32)'
             f" (global.set $heap (i32.const 65536)) {body} {ret})"]
    if post is not None:
        parts.append(f'(func (export "cabi_post_mid-process") (param i32) {post})')
    if initialize is not None:
        parts.append(f'(func (export "_initialize") {initialize})')
    return wat2wasm("(module " + "\n".join(parts) + extra + ")")


@functools.lru_cache(maxsize=None)
def wat2wasm(text: str) -> bytes:
    return wasmtime.wat2wasm(text)


def store(addr: int, value: int) -> str:
    return f"(i32.store (i32.const {addr}) (i32.const {value}))"


def splice(*, when: tuple[int, ...] = (), backtrack: int = 0, ff: tuple[int, ...] = ()) -> str:
    """Statements that give the branch one splice."""
    out = [store(1060, 3072), store(1064, 1), store(3072, 3200), store(3076, len(when)), store(3080, backtrack),
           store(3084, 3200 + 4 * len(when)), store(3088, len(ff))]
    out += [store(3200 + 4 * i, t) for i, t in enumerate((*when, *ff))]
    return " ".join(out)


def no_mask() -> str:
    return store(1040, 0)


def loop_forever() -> str:
    return "(loop $l (br $l))"


def spin(iterations: int) -> str:
    """A busy loop of about `iterations` rounds (a few ns each)."""
    return (f"(block $done (loop $l (br_if $done (i32.ge_u (global.get $heap) (i32.const {65536 + iterations})))"
            " (global.set $heap (i32.add (global.get $heap) (i32.const 1))) (br $l))) (global.set $heap (i32.const 65536))")
