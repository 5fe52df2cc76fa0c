"""Memory that comes back (issue 27): what a hostile sequence leaves behind once it has ended,
counted as objects, native handles and slots, never as RSS (which the allocator, the load and
the test runner move): a soak's slope is bench/hostile_soak.py's job."""
from __future__ import annotations

import time
from pathlib import Path

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
    from aicirt.core.memory import heap_stats, trim_heap
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


# The kinds whose ends take every path a sequence's memory goes back by: a call interrupted at
# its hard limit (result read, or closed mid-call: loopers aborted by the engine's close), a trap
# in post-return and in realloc, forks past the limit, floods of log and variables, a stack overflow.
ENDING_KINDS = ("loop-every-call", "fork-then-both-loop", "loop-in-post-return", "trap-in-post-return",
                "trap-in-realloc", "stack-overflow", "fork-bomb", "too-many-forks-at-once", "log-flood",
                "variable-flood", "noop-forever")


def test_hostile_sequences_leave_no_sequence_slot_or_budget_behind(make_rt):
    """After hostile sequences of every ending path have ended (closed mid-call ones collected):
    no Sequence object is left, no slot is registered, no call is out or closing, the memory budget
    holds nothing, and every slot the sequences had has freed its Store, log, trap and error."""
    import gc
    import weakref

    from hostile.kinds import KINDS
    from hostile.runner import Spec

    from aicirt.build import toolchain
    from aicirt.testing import Choices, EngineSettings, FuzzEngine

    hostile_c = toolchain.build_cached(Path(__file__).resolve().parent / "hostile" / "hostile.c")
    rt = make_rt(call_timeout_s=HARD_LIMIT_S, first_call_timeout_s=HARD_LIMIT_S)
    by_name = {k.name: k for k in KINDS}
    seqs: "weakref.WeakSet[aicirt.Sequence]" = weakref.WeakSet()
    slots = []

    def note(engine) -> None:     # every sequence made so far, forks too (a function: no loop variable outlives it)
        for seq in [s for t in engine.tracks if t.seq is not None for s in t.seq.request.sequences]:
            if seq not in seqs:
                seqs.add(seq)
                slots.append(seq.slot)

    for name in ENDING_KINDS:
        kind = by_name[name]
        spec = Spec(kind.wasm if kind.wasm is not None else hostile_c, kind.arg, capabilities=kind.capabilities)
        engine = FuzzEngine(rt, lambda label: Choices(replay=[]), Choices(replay=[]), EngineSettings(max_tokens=8))
        ctrl = rt.load(spec.wasm)
        for copy in range(2):
            engine.add(rt.new_request(ctrl, spec.arg, spec.capabilities), list(spec.prompt), f"x{copy}")
        for _ in range(12):       # a few steps: some end, loopers and noop-forever are still live or out
            if all(t.finished for t in engine.tracks):
                break
            engine.step()
            note(engine)
        engine.close()            # aborts what is left, mid-call or not
        extra = rt.new_request(ctrl, spec.arg, spec.capabilities).spawn()    # and one closed mid-call for sure
        seqs.add(extra)
        slots.append(extra.slot)
        rt.submit([StepInput(extra, list(spec.prompt))]).wait(0.0)
        extra.request.close()     # with the forks its call made, if it ended in time to make them
        del engine, ctrl, extra
    _collect_until_freed(rt)
    gc.collect()
    assert len(slots) >= 3 * len(ENDING_KINDS)
    assert len(seqs) == 0, f"{len(seqs)} sequences still alive: {[s.state for s in seqs]}"
    assert rt.live_sequences == 0 and rt.registry.calls_out == 0 and rt.registry.closing_count == 0
    assert rt.memory_budget.sequences == 0 and rt.memory_budget.reserved_bytes == 0
    null = rt.native.ffi.NULL
    left = [i for i, s in enumerate(slots) if s.store != null or s.log != null or s.trap != null or s.error != null]
    assert not left, f"{len(left)} of {len(slots)} slots still hold a Store, log, trap or error"


def _stack_mappings() -> int | None:
    """Mappings the size of a thread's default stack (RLIMIT_STACK; None where it is unlimited)."""
    import resource
    size = resource.getrlimit(resource.RLIMIT_STACK)[0]
    if size <= 0 or size == resource.RLIM_INFINITY:
        return None
    n = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        n += hi - lo == size and fields[1] == "rw-p" and len(fields) == 5
    return n


def test_workers_that_leave_are_joined_and_their_stacks_unmapped(make_rt):
    """Stalled calls get replacement workers, and a stalled worker leaves once its call ends: the
    pool joins it soon after (pool.c's join_exited), so its stack is unmapped. Before, only the
    entry a new worker reused was joined, and every dead worker kept its stack mapped (its top
    pages resident) until the runtime closed: 24 loopers at a time left ~20 stacks behind."""
    import resource
    before = _stack_mappings()
    if before is None:
        import pytest
        pytest.skip("unlimited stack size: threads get no stack of a known size")
    cached = (40 << 20) // resource.getrlimit(resource.RLIMIT_STACK)[0]   # glibc keeps up to 40 MiB of freed stacks
    rt = make_rt(call_timeout_s=HARD_LIMIT_S, first_call_timeout_s=HARD_LIMIT_S, soft_deadline_s=0.01)
    ctrl = rt.load(module(loop_forever()))
    for _ in range(3):            # stalled calls past the base workers: extra workers come and go
        seqs = [rt.new_request(ctrl).spawn() for _ in range(24)]
        out = rt.submit([StepInput(s, [1]) for s in seqs]).wait(WAIT_S)
        assert all(r.status == "error" for r in out.results), [r.status for r in out.results]
        for s in seqs:
            s.close()
    threads = lambda: len(list(Path("/proc/self/task").iterdir()))   # noqa: E731
    deadline = time.monotonic() + WAIT_S
    while _stack_mappings() > before + threads() + cached and time.monotonic() < deadline:
        time.sleep(0.05)          # the ticker joins them within a tick or so
    assert _stack_mappings() <= before + threads() + cached, (before, _stack_mappings(), threads(), cached)
