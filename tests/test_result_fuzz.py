"""Fuzz the result lifter: a controller returns arbitrary bytes as its result (pointers into them,
lengths, tags, temperatures). Whatever they say, the runtime returns "ok" with a well-formed
result or "error" with a message; it never raises and never harms the sequence beside it."""
from __future__ import annotations

import struct

import numpy as np
import wasmtime
from _budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aicirt
from aicirt import StepInput

BASE = 65536  # the argument (the fuzzed result) is copied here on every call
RAW = wasmtime.wat2wasm(f"""(module
  (import "aici:controller/host@0.1.0" "arg" (func $arg (param i32)))
  (memory (export "memory") 3)
  (global $bump (mut i32) (i32.const {BASE}))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $bump))
    (global.set $bump (i32.add (global.get $bump) (local.get 3)))
    (local.get $p))
  (func (export "mid-process") (param i32 i32 i32 i32 i32 i32 i32) (result i32)
    (global.set $bump (i32.const {BASE}))
    (call $arg (i32.const 0))
    (i32.const {BASE})))""")

W = (257 + 31) // 32
u32 = st.integers(0, 2**32 - 1)


@st.composite
def results(draw):
    """Words of a result laid out at BASE: header, branches, splices, then token/mask data."""
    n = draw(st.integers(0, 4))
    data: list[int] = []

    def place(words):               # returns the absolute address of `words` in the data area
        data.extend(words)
        return len(data) - len(words)

    branches = []
    for _ in range(n):
        tag = draw(st.sampled_from([0, 1, 1, 2]))
        mask = draw(st.lists(u32, min_size=W, max_size=W))
        if draw(st.integers(0, 3)):  # mostly a valid mask: no bits past the vocabulary, one bit set
            mask[-1] &= 1
            t = draw(st.integers(0, 256))
            mask[t // 32] |= 1 << (t % 32)
        elif draw(st.booleans()):
            mask = draw(st.lists(u32, max_size=W + 2))
        mptr = place(mask)
        temp_tag = draw(st.sampled_from([0, 1]))
        temp = draw(st.floats(0, 2, width=32) if draw(st.integers(0, 4)) else st.floats(width=32))
        splices = []
        for _ in range(draw(st.integers(0, 3)) if tag else 1):
            when_ids = draw(st.lists(st.integers(0, 260), max_size=3)) if tag else []
            ff_ids = draw(st.lists(st.integers(0, 260), max_size=3))
            when, ff = place(when_ids), place(ff_ids)
            lens = (len(when_ids), len(ff_ids)) if draw(st.integers(0, 5)) else (draw(u32), draw(u32))
            splices.append((when, lens[0], draw(st.integers(0, 5)), ff, lens[1]))
        branches.append((tag, mptr, len(mask) if draw(st.integers(0, 5)) else draw(u32), temp_tag, temp, splices))
    header_words = 2 + 7 * n + 5 * sum(len(b[5]) for b in branches)
    addr = lambda i: BASE + 4 * (header_words + i)  # noqa: E731
    out = bytearray()
    bptr = BASE + 8 if draw(st.integers(0, 9)) else draw(u32)
    out += struct.pack("<II", bptr, n if draw(st.integers(0, 9)) else draw(u32))
    splice_at = BASE + 8 + 28 * n
    for tag, mptr, mlen, temp_tag, temp, splices in branches:
        out += struct.pack("<BxxxIIBxxxfII", tag, addr(mptr), mlen, temp_tag, temp, splice_at, len(splices))
        splice_at += 20 * len(splices)
    for _, _, _, _, _, splices in branches:
        for when, wlen, bt, ff, flen in splices:
            out += struct.pack("<IIIII", addr(when), wlen, bt, addr(ff), flen)
    out += struct.pack(f"<{len(data)}I", *data)
    return bytes(out)


_rt = None


def runtime():
    global _rt
    if _rt is None:
        _rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, limits=aicirt.Limits(soft_deadline_s=5.0))
        _rt.raw = _rt.load(RAW)
    return _rt


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(results(), st.sampled_from([aicirt.Capabilities.ALL, aicirt.Capabilities.NONE]))
def test_any_result_bytes_lift_or_error(blob, caps):
    rt = runtime()
    fuzzed = rt.new_request(rt.raw, arg=blob, capabilities=caps).spawn()
    calm = rt.new_request(rt.raw, arg=struct.pack("<IIBxxxIIBxxxfII", BASE + 8, 1, 1, BASE + 36, W, 0, 0.0, 0, 0)
                          + struct.pack(f"<{W}I", *([1] + [0] * (W - 1)))).spawn()
    out = rt.submit([StepInput(fuzzed, [1, 2, 3], None), StepInput(calm, [1], None)]).wait()
    r, c = out.results
    assert c.status == "ok" and out.masks[c.branches[0].mask_row][0] == 1
    assert r.status in ("ok", "error")
    if r.status == "error":
        assert r.error and fuzzed.finished
    else:
        assert len(r.forks) == max(0, len(r.branches) - 1)
        for b in r.branches:
            if b.mask_row is not None:
                row = out.masks[b.mask_row]
                assert row.any() and not int(row[-1]) >> (257 % 32)
            else:
                assert len(b.splices) == 1 and not b.splices[0].when_sampled
            assert b.temperature is None or (np.isfinite(b.temperature) and b.temperature >= 0)
    for s in (fuzzed, calm, *r.forks):
        s.close()
