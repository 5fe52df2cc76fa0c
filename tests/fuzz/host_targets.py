"""Fuzz target for host-import arguments: a controller calls one host import with four
arbitrary i32 arguments (pointers, lengths, return areas) taken from its argument, beside a
healthy sequence. Whatever the arguments, the call ends as "ok" or as an error naming the
import (or refusing a result the import overwrote), and the neighbour is untouched. Needs the scripted-free WAT skeleton of the hostile suite.
"""
from __future__ import annotations

import struct

from hostile.wat import module

import aicirt
from aicirt import StepInput

CALLS = [
    "(call $log (local.get $tp) (local.get $tn))",
    "(call $var-set (local.get $tp) (local.get $tn) (local.get $ss) (local.get $s))",
    "(call $var-append (local.get $tp) (local.get $tn) (local.get $ss) (local.get $s))",
    "(call $var-get (local.get $tp) (local.get $tn) (local.get $ss))",
    "(call $tokenize (local.get $tp) (local.get $tn) (local.get $ss))",
    "(call $detokenize (local.get $tp) (local.get $tn) (local.get $ss))",
    "(call $token-trie (local.get $tp))",
    "(call $arg (local.get $tp))",
]


def _dispatch() -> str:
    n = len(CALLS)
    head = "".join(f"(block $c{i} " for i in range(n - 1, -1, -1))
    table = " ".join(f"$c{i}" for i in range(n))
    out = f"(block $done {head}(br_table {table} (i32.rem_u (i32.load8_u (local.get $bt)) (i32.const {n}))))"
    for i in range(n):
        out += f" {CALLS[i]} (br $done))" if i < n - 1 else f" {CALLS[i]})"
    return out


# $bt..$s are mid-process's own parameters, reused as locals: the argument's address, then a..d.
BODY = ("(call $arg (i32.const 8192)) (local.set $bt (i32.load (i32.const 8192)))"
        " (if (i32.lt_u (i32.load (i32.const 8196)) (i32.const 20)) (then unreachable))"
        " (local.set $tp (i32.load offset=4 (local.get $bt))) (local.set $tn (i32.load offset=8 (local.get $bt)))"
        " (local.set $ss (i32.load offset=12 (local.get $bt))) (local.set $s (i32.load offset=16 (local.get $bt)))"
        + _dispatch())
WASM = module(BODY, imports=("log", "var-set", "var-append", "var-get", "tokenize", "detokenize", "token-trie", "arg"),
              memory="4")
HEALTHY = module()
_state: dict = {}


def _runtime():
    if not _state:
        rt = _state["rt"] = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False,
                                           limits=aicirt.Limits(host_arg_bytes=1 << 16, variable_bytes=1 << 20))
        _state["ctrl"], _state["healthy"] = rt.load(WASM), rt.load(HEALTHY)
    return _state["rt"]


def host_call(data: bytes) -> None:
    rt = _runtime()
    arg = data[:20].ljust(20, b"\0") + data[20:]
    bad = rt.new_request(_state["ctrl"], arg).spawn()
    good = rt.new_request(_state["healthy"]).spawn()
    out = rt.submit([StepInput(bad, [1, 2]), StepInput(good, [1, 2])]).wait(1.0)
    r, g = out.results
    assert g.status == "ok" and out.masks[g.branches[0].mask_row][2] == 2, "the healthy neighbour was harmed"
    assert r.status in ("ok", "error"), r.status
    if r.status == "error":
        # an import that succeeded may have written over the controller's own result (e.g.
        # token-trie at the result's address): then that result is refused as malformed
        assert r.error.startswith(("host import `", "trap: ", "variables would take")) or (
            r.error and "Traceback" not in r.error and "Error(" not in r.error), r.error
    bad.close()
    good.close()


def words(selector: int, a: int, b: int, c: int, d: int, tail: bytes = b"") -> bytes:
    return struct.pack("<B3xIIII", selector, a, b, c, d) + tail
