"""A host import that fails in Python ends its sequence with an error: never
printed and swallowed by cffi as a success (re-entrant cabi_realloc up to the recursion limit)."""
from __future__ import annotations

import sys

import pytest
from hostile import wat

from aicirt import StepInput

# cabi_realloc itself calls `arg` (which allocates the argument's copy through cabi_realloc): every
# allocation recurses until something gives out (Wasm's stack, or the nesting limit of Python imports)
REENTRANT = wat.module(imports=("arg",), realloc=wat.REALLOC.replace(
    "(local $p i32)", "(local $p i32) (call $arg (i32.const 4000))"))


@pytest.mark.parametrize("headroom", range(0, 12))
def test_reentrant_realloc_ends_the_sequence(make_rt, headroom):
    """At each offset into the recursion's frame cycle (the limit moved a frame at a time), the
    sequence ends in error and a healthy neighbour is untouched."""
    rt = make_rt()
    bad = rt.new_request(rt.load(REENTRANT), arg=b"x").spawn()
    good = rt.new_request(rt.load(wat.module())).spawn()
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(400 + headroom)
    try:
        out = rt.submit([StepInput(bad, [1, 2], None), StepInput(good, [1, 2], None)]).wait()
    finally:
        sys.setrecursionlimit(old)
    b, g = out.results
    assert b.status == "error", b
    assert g.status == "ok", g.error


class Escape(BaseException):
    """Not an Exception: the handler's own `except Exception` lets it through to the trampoline."""


def test_an_exception_past_the_handler_is_the_sequences_error(monkeypatch):
    from aicirt.host import host_imports
    import aicirt

    def boom(self, seq, g, ptr, n, retptr):
        raise Escape("tokenizer gone")
    monkeypatch.setattr(host_imports.HostImports, "h_tokenize", boom)
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False)
    try:
        bad = rt.new_request(rt.load(wat.module("(call $tokenize (i32.const 0) (i32.const 1) (i32.const 4000))",
                                                imports=("tokenize",)))).spawn()
        good = rt.new_request(rt.load(wat.module())).spawn()
        b, g = rt.submit([StepInput(bad, [1, 2], None), StepInput(good, [1, 2], None)]).wait().results
        assert b.status == "error" and "host import `tokenize` failed: Escape: tokenizer gone" in b.error, b
        assert g.status == "ok", g.error
    finally:
        rt.close()


def test_python_imports_nested_in_realloc_end_the_sequence():
    """cabi_realloc calling `tokenize` (a Python import), which allocates: nested
    until the bound, then that sequence's error (each level's realloc failing in turn)."""
    import aicirt
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False)
    try:
        mod = wat.module(imports=("tokenize",), realloc=wat.REALLOC.replace(
            "(local $p i32)", "(local $p i32) (i32.store8 (i32.const 3000) (i32.const 104))"
                              "(call $tokenize (i32.const 3000) (i32.const 1) (i32.const 4000))"))
        bad = rt.new_request(rt.load(mod)).spawn()
        b = rt.submit([StepInput(bad, [1, 2], None)]).wait().results[0]
        assert b.status == "error" and "host import `tokenize`" in b.error, b
    finally:
        rt.close()
