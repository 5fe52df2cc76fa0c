"""Fork's page copy (runtime/native/pages.c and its numpy twin in pages.py): exact copies that
write only the pages that differ, on both hot paths."""
from __future__ import annotations

import mmap

import numpy as np
from hostile.wat import module

from aicirt import StepInput
from aicirt.native import get_native, pages

MIB = 1 << 20
PAGE = 4096
WASM_PAGE = 1 << 16


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
    src[PAGE + 50] = 0                       # page 1: an image byte cleared: written
    src[3 * PAGE] = 1
    src[11 * PAGE - 1] = 2                   # the last byte of page 10
    src[5 * PAGE] = 9
    src[5 * PAGE] = 0                        # page 5: backed but zero again: skipped
    src[40 * PAGE:42 * PAGE] = b"\x01" * (2 * PAGE)   # a run of two pages
    src[n - 1] = 3                           # the last page
    written = pages.copy_changed(native, _addr(dst), _addr(src), n, (0, 2 * PAGE))
    assert dst[:] == src[:]
    assert written == 1 + 1 + 1 + 2 + 1
    assert pages.nonzero_extent(native, _addr(dst), n) == (0, n)
    assert pages.nonzero_extent(native, _addr(mmap.mmap(-1, n)), n) == (0, 0)
    assert pages.copy_changed(native, _addr(dst), _addr(src), 0, (0, 0)) == 0


def test_copy_changed_over_random_pages_is_exact(hot_path):
    """Randomized: pages backed or not, zero or not, in the image or not, dirty destination image."""
    native = get_native()
    rng = np.random.default_rng(7)
    n = 96 * PAGE
    for _ in range(20):
        src, dst = mmap.mmap(-1, n), mmap.mmap(-1, n)
        lo, hi = sorted(int(x) for x in rng.integers(0, 96, 2))
        img = rng.integers(0, 256, (hi - lo) * PAGE, dtype=np.uint8).tobytes()
        dst[lo * PAGE:hi * PAGE] = img
        src[lo * PAGE:hi * PAGE] = img
        for page in rng.choice(96, 30, replace=False):
            at = int(page) * PAGE + int(rng.integers(0, PAGE))
            src[at] = int(rng.integers(0, 2)) * int(rng.integers(1, 256))   # a write, maybe of a zero
        pages.copy_changed(native, _addr(dst), _addr(src), n, (lo * PAGE, hi * PAGE))
        assert dst[:] == src[:]


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


def test_a_fork_child_runs_on_from_the_parents_state(rt):
    """The child's calls see what the parent's calls wrote (a counter in memory and a global)."""
    counting = "(i32.store (i32.const 5000) (i32.add (i32.load (i32.const 5000)) (i32.const 1)))" \
               " (global.set $calls (i32.add (global.get $calls) (i32.const 1)))"
    ctrl = rt.load(module(counting))
    parent = rt.new_request(ctrl).spawn()
    for step in range(3):
        assert rt.submit([StepInput(parent, [1] * (step + 1))]).wait().results[0].status == "ok"
    child = parent.fork()
    assert rt.submit([StepInput(child, [1, 1, 1, 1])]).wait().results[0].status == "ok"
    read = lambda s: int.from_bytes(s.memory.read(s.store, 5000, 5004), "little")  # noqa: E731
    assert (read(parent), read(child)) == (3, 4)
    assert sorted(g.value(child.store) for g in child._globals.values()) == [4, 65536]   # $calls, $heap
