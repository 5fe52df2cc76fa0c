"""Memory that comes back (issue 27): what a hostile sequence leaves behind once it has ended,
counted as objects, native handles and slots, never as RSS (which the allocator, the load and
the test runner move): a soak's slope is bench/hostile_soak.py's job."""
from __future__ import annotations

import time

from hostile.wat import loop_forever, module

import aicirt
from aicirt import StepInput

HARD_LIMIT_S = 0.05
WAIT_S = 60.0       # a hang guard: the calls end at their CPU limit (or the wall backstop)


def _collect_until_freed(rt: aicirt.Runtime) -> None:
    deadline = time.monotonic() + WAIT_S
    while rt.registry.closing_count and time.monotonic() < deadline:
        rt.collect()
        time.sleep(0.02)
    assert rt.registry.closing_count == 0, "the closed sequences' calls never ended"


def test_a_call_that_ends_after_its_sequence_closed_leaves_no_trap_behind(make_rt):
    """A looping call interrupted at its hard limit after its sequence was closed (a server's
    abort, max_tokens) leaves a wasm trap in the slot (with its backtrace, ~0.3-0.7 KiB of C heap):
    no result ever reads it, so freeing the slot frees it (it leaked once per such sequence: the
    looping kinds of bench/hostile_soak.py grew the C heap ~0.3 KiB a sequence)."""
    rt = make_rt(call_timeout_s=HARD_LIMIT_S, first_call_timeout_s=HARD_LIMIT_S)
    ctrl = rt.load(module(loop_forever()))
    seqs = [rt.new_request(ctrl).spawn() for _ in range(6)]
    slots = [s.slot for s in seqs]          # kept: the test reads them after the sequences are freed
    out = rt.submit([StepInput(s, [1]) for s in seqs]).wait(0.0)
    assert all(r.status == "pending" for r in out.results)
    for s in seqs:
        s.close()
    assert rt.registry.closing_count == len(seqs)
    _collect_until_freed(rt)
    assert rt.live_sequences == 0
    null = rt.native.ffi.NULL
    assert all(slot.trap == null and slot.error == null for slot in slots), \
        [(rt.native.addr(slot.trap), rt.native.addr(slot.error)) for slot in slots]
    assert all(slot.store == null and slot.log == null for slot in slots)


def test_a_finished_call_whose_result_was_read_leaves_nothing_either(make_rt):
    """The usual path, for contrast: the result reads the trap (its message) and frees it."""
    rt = make_rt(call_timeout_s=HARD_LIMIT_S, first_call_timeout_s=HARD_LIMIT_S)
    ctrl = rt.load(module(loop_forever()))
    seq = rt.new_request(ctrl).spawn()
    slot = seq.slot
    r = rt.submit([StepInput(seq, [1])]).wait(WAIT_S).results[0]
    assert r.status == "error" and "time limit" in r.error, r.error
    null = rt.native.ffi.NULL
    assert slot.trap == null and slot.error == null
    seq.close()
    assert slot.store == null and rt.live_sequences == 0


def test_heap_stats_reads_the_c_heap():
    """memory.heap_stats: glibc's mallinfo2 in bytes (what bench/hostile_soak.py reports)."""
    from aicirt.memory import heap_stats, trim_heap
    before = heap_stats()
    if before is None:
        import pytest
        pytest.skip("no glibc mallinfo2 here")
    assert set(before) == {"in_use", "free", "arena", "mmapped"} and all(v >= 0 for v in before.values())
    block = bytearray(200 << 10)        # under the mmap threshold: a chunk of the heap
    during = heap_stats()
    assert during["in_use"] + during["mmapped"] >= before["in_use"] + before["mmapped"] + (200 << 10) - (64 << 10)
    del block
    assert trim_heap() is True
