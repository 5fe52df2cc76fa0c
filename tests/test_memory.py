"""Fork's page copy (runtime/native/pages.c and its numpy twin) and memory that goes back
(runtime/native/resident.py): exact copies, and freed slots' resident pages returned to the OS."""
from __future__ import annotations

import mmap
import time
from pathlib import Path

import numpy as np
import pytest
from hostile.wat import module

import aicirt
from aicirt import StepInput
from aicirt.native import get_native
from aicirt.native.resident import ResidentSlots

MIB = 1 << 20
PAGE = 4096
WASM_PAGE = 1 << 16
# counts _initialize runs at address 5000
COUNTING_INIT = "(i32.store (i32.const 5000) (i32.add (i32.load (i32.const 5000)) (i32.const 1)))"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def memory_bytes(seq) -> bytes:
    return seq.memory.read(seq.store, 0, seq.memory.data_len(seq.store))


def _addr(buf: mmap.mmap) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


# -- the page copy -----------------------------------------------------------------------------
def test_copy_changed_writes_exactly_the_pages_that_differ(hot_path):
    """Into a fresh memory (zero but for its image), only pages that differ are written: nonzero
    pages, image pages that changed (even to zero); never-touched and zeroed pages are skipped."""
    native = get_native()
    n = 64 * PAGE
    src, dst = mmap.mmap(-1, n), mmap.mmap(-1, n)   # page-aligned, never backed
    image = b"\x07" * 100
    dst[0:100] = image
    dst[PAGE:PAGE + 100] = image
    src[0:100] = image                       # page 0: the same image: skipped
    src[PAGE + 50] = 0                       # page 1: image byte cleared: written
    src[3 * PAGE] = 1
    src[11 * PAGE - 1] = 2                   # the last byte of page 10
    src[5 * PAGE] = 9
    src[5 * PAGE] = 0                        # page 5: backed but zero again: skipped
    src[40 * PAGE:42 * PAGE] = b"\x01" * (2 * PAGE)   # a run of two pages
    written = native.copy_changed(_addr(dst), _addr(src), n, (0, 2 * PAGE))
    assert dst[:] == src[:]
    assert written == 1 + 1 + 1 + 2
    assert native.nonzero_extent(_addr(dst), n) == (0, 42 * PAGE)
    assert native.nonzero_extent(_addr(mmap.mmap(-1, n)), n) == (0, 0)


def test_fork_copies_memory_exactly_into_a_reused_slot(rt):
    """Scattered writes, a cleared data byte, grown pages: the child's memory equals the parent's
    byte for byte, also in a slot an earlier child wrote elsewhere (it was reset, not copied over)."""
    ctrl = rt.load(module())
    parent = rt.new_request(ctrl).spawn()
    parent.memory.grow(parent.store, 20)
    parent.memory.write(parent.store, b"\0", 1040)                 # the data image, changed to zero
    parent.memory.write(parent.store, b"first", 5 * WASM_PAGE + 7)
    first = parent.fork()
    assert memory_bytes(first) == memory_bytes(parent)
    first.memory.write(first.store, b"child's own", 9 * WASM_PAGE)
    first.close()                                                   # its slot goes back, dirty
    parent.memory.write(parent.store, b"\0" * 5, 5 * WASM_PAGE + 7)
    parent.memory.write(parent.store, b"end", 22 * WASM_PAGE - 3)   # the last bytes
    second = parent.fork()
    assert memory_bytes(second) == memory_bytes(parent)
    assert second.memory.read(second.store, 9 * WASM_PAGE, 9 * WASM_PAGE + 11) == b"\0" * 11
    for idx, g in parent._globals.items():
        assert second._globals[idx].value(second.store) == g.value(parent.store)


def test_a_fork_of_an_initialized_parent_does_not_run_initialize_again(rt):
    ctrl = rt.load(module(initialize=COUNTING_INIT))
    parent = rt.new_request(ctrl).spawn()
    assert rt.submit([StepInput(parent, [1])]).wait().results[0].status == "ok"
    child = parent.fork()
    assert rt.submit([StepInput(child, [1, 2])]).wait().results[0].status == "ok"
    read = lambda s: int.from_bytes(s.memory.read(s.store, 5000, 5004), "little")  # noqa: E731
    assert read(parent) == 1 and read(child) == 1
    unstarted = rt.new_request(ctrl).spawn().fork()      # forked before its first call: runs it once
    assert rt.submit([StepInput(unstarted, [1])]).wait().results[0].status == "ok"
    assert read(unstarted) == 1


# -- memory that goes back -----------------------------------------------------------------------
def _burst(runtime, n: int = 48):
    """`n` live sequences of 1 MiB + 128 KiB of linear memory each (wasmtime keeps 1 MiB of each
    freed one resident, zeroed); returns them."""
    ctrl = runtime.load(module())
    seqs = [runtime.new_request(ctrl).spawn() for _ in range(n)]
    for s in seqs:
        s.memory.grow(s.store, 16)
    return seqs


def test_freed_slots_hold_memory_until_trimmed_and_then_give_it_back():
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False,
                        limits=aicirt.Limits(resident_bytes=1 << 30, resident_idle_s=3600))
    try:
        seqs = _burst(rt)
        before = rss_bytes()
        for s in seqs:
            s.close()
        assert rt.resident.held_bytes == 48 * MIB
        held = rss_bytes()
        assert held - before > 24 * MIB          # the resident slots are real (wasmtime zeroed them)
        assert rt.resident.trim() == 48 * MIB
        assert rt.resident.held_bytes == 0
        assert held - rss_bytes() > 24 * MIB
    finally:
        rt.close()


def test_the_resident_budget_bounds_what_freed_slots_hold():
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False,
                        limits=aicirt.Limits(resident_bytes=4 * MIB, resident_idle_s=3600))
    try:
        seqs = _burst(rt)
        before = rss_bytes()
        for s in seqs:
            s.close()
        assert rt.resident.held_bytes <= 4 * MIB
        assert rt.resident.given_back_bytes >= 44 * MIB
        assert rss_bytes() - before < 24 * MIB
    finally:
        rt.close()


def test_an_idle_runtime_gives_everything_back():
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False,
                        limits=aicirt.Limits(resident_bytes=1 << 30, resident_idle_s=0.05))
    try:
        seqs = _burst(rt)
        for s in seqs:
            s.close()
        held = rss_bytes()
        deadline = time.monotonic() + 60      # generous: the idle watch runs every 20 ms
        while rt.resident.held_bytes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rt.resident.held_bytes == 0
        assert held - rss_bytes() > 24 * MIB
    finally:
        rt.close()


def test_a_trimmed_slot_serves_its_next_instance_as_new(rt):
    """Given back, a slot still starts its next instance from the module's image and zeros, and
    runs it and its forks correctly."""
    ctrl = rt.load(module())
    seqs = [rt.new_request(ctrl).spawn() for _ in range(8)]
    fresh = memory_bytes(seqs[0])
    for s in seqs:
        s.memory.grow(s.store, 4)
        s.memory.write(s.store, b"left behind", 1100)
        s.memory.write(s.store, b"left behind", 3 * WASM_PAGE)
        s.close()
    rt.resident.trim()
    again = [rt.new_request(ctrl).spawn() for _ in range(8)]
    for s in again:
        assert memory_bytes(s) == fresh
        out = rt.submit([StepInput(s, [1])]).wait().results[0]
        assert out.status == "ok"
        assert memory_bytes(s.fork()) == memory_bytes(s)


def test_resident_settings_are_validated():
    with pytest.raises(ValueError, match="resident_bytes"):
        aicirt.Limits(resident_bytes=-1)
    with pytest.raises(ValueError, match="resident_idle_s"):
        aicirt.Limits(resident_idle_s=0)
    with pytest.raises(ValueError, match="idle"):
        ResidentSlots(0, 0.0, MIB)
    slots = ResidentSlots(0, 1.0, MIB)
    slots.close()
    slots.close()   # idempotent


def test_large_freed_buffers_go_back_to_the_os():
    """glibc raises its mmap threshold after a large free unless pinned: the next large buffer
    then comes from the heap and stays resident once freed (the variable floods' RSS growth)."""
    import ctypes

    from aicirt.native import resident
    aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False).close()   # a Runtime pins it
    if not resident.pin_mmap_threshold():
        pytest.skip("not glibc on Linux")
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    first = libc.malloc(16 * MIB)
    ctypes.memset(first, 1, 16 * MIB)
    libc.free(first)                       # unpinned, this would raise the threshold to 16 MiB
    before = rss_bytes()
    second = libc.malloc(16 * MIB)
    ctypes.memset(second, 1, 16 * MIB)
    libc.free(second)
    assert rss_bytes() - before < 8 * MIB
