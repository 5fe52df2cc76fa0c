"""Fork's page copy (runtime/native/pages.c): exact copies that write only the pages that differ. Memory that goes back (memory.ResidentSlots):
freed slots' resident pages bounded by Limits.resident_bytes and returned to the OS when idle.
RSS is read from /proc/self/status, with margins of half what is at stake."""
from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import numpy as np
import pytest
from hostile.wat import module

import aicirt
from aicirt import StepInput
from aicirt.native import get_native, pages
from aicirt.native.instance import fork_copy
from aicirt.core.memory import ResidentSlots

MIB = 1 << 20
PAGE = 4096
WASM_PAGE = 1 << 16


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def memory_bytes(seq) -> bytes:
    return seq.memory.read(seq.store, 0, seq.memory.data_len(seq.store))


def _private(n: int) -> mmap.mmap:
    """n bytes, page-aligned, never backed, private like wasmtime's linear memories (pages.c reads
    a present shared page in the image as the image's own, never written)."""
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _addr(buf: mmap.mmap) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


# -- the page copy -----------------------------------------------------------------------------
def test_copy_changed_writes_exactly_the_pages_that_differ():
    """Into a fresh memory (zero but for its image), only pages that differ are written: nonzero
    pages, image pages that changed (even to zero); never-touched and zeroed pages are skipped."""
    native = get_native()
    n = 64 * PAGE
    src, dst = _private(n), _private(n)
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
    written = pages.copy_changed(native, _addr(dst), _addr(src), n, (0, 2 * PAGE), 0, n)   # dst resident: compared
    assert dst[:] == src[:]
    assert written == 1 + 1 + 1 + 2 + 1
    assert pages.nonzero_extent(native, _addr(dst), n) == (0, n)
    assert pages.nonzero_extent(native, _addr(_private(n)), n) == (0, 0)
    assert pages.copy_changed(native, _addr(dst), _addr(src), 0, (0, 0)) == 0


def test_copy_changed_skips_image_pages_the_parent_never_wrote():
    """An image page the parent only read (still the image file's copy-on-write page, as
    wasmtime maps a module's data) or never touched is not compared: a fork costs what the parent
    wrote, not the image's size. Pages it wrote are compared and copied where they differ."""
    native = get_native()
    src, dst = _image_parent(16)
    written = pages.copy_changed(native, _addr(dst), _addr(src), len(src), (0, len(src)), 0, len(src))
    assert written == 1
    assert dst[5 * PAGE:6 * PAGE] == src[5 * PAGE:6 * PAGE]
    assert dst[2 * PAGE] == 0xEE          # proof that page 2 was skipped
    dst[2 * PAGE] = src[2 * PAGE]
    assert dst[:] == src[:]


def _image_parent(n_pages: int) -> tuple[mmap.mmap, mmap.mmap]:
    """(src, dst): src maps an image copy-on-write (as wasmtime maps a module's data) and wrote
    pages 5 (changed) and 7 (the same byte back); dst is the image in private pages, page 2 made
    to differ (a page src never wrote)."""
    if not hasattr(os, "memfd_create"):
        pytest.skip("memfd_create (Linux)")
    n = n_pages * PAGE
    fd = os.memfd_create("image")
    os.write(fd, bytes(range(256)) * (n // 256))
    src = mmap.mmap(fd, n, flags=mmap.MAP_PRIVATE)   # the parent: the image, copy-on-write
    os.close(fd)
    dst = _private(n)
    dst[:] = src[:]                       # reads every src page: present, still file pages
    dst[2 * PAGE] = 0xEE                  # differs, but the parent never wrote page 2: not compared
    src[5 * PAGE + 9] = 0xAA              # written and changed
    src[7 * PAGE + 1] = src[7 * PAGE + 1]   # written, unchanged
    return src, dst


def test_an_image_page_the_parent_wrote_is_copied_unread_where_the_child_is_not_resident():
    """Past the child's resident prefix (`dst_backed`), an image page the parent wrote is copied
    without reading the child's page (reading it would fault it in from the image only to
    compare): page 7, written back unchanged, is copied too; inside the prefix it is compared."""
    native = get_native()
    src, dst = _image_parent(16)
    written = pages.copy_changed(native, _addr(dst), _addr(src), len(src), (0, len(src)), 0, 6 * PAGE)
    assert written == 2                   # page 5 (inside the prefix: it differs), page 7 (past it)
    assert dst[2 * PAGE] == 0xEE          # page 2: never written by the parent, still skipped
    dst[2 * PAGE] = src[2 * PAGE]
    assert dst[:] == src[:]


def test_copy_changed_over_random_pages_is_exact():
    """Randomized: pages backed or not, zero or not, in the image or not, dirty destination image."""
    native = get_native()
    rng = np.random.default_rng(7)
    n = 96 * PAGE
    for _ in range(20):
        src, dst = _private(n), _private(n)
        lo, hi = sorted(int(x) for x in rng.integers(0, 96, 2))
        img = rng.integers(0, 256, (hi - lo) * PAGE, dtype=np.uint8).tobytes()
        dst[lo * PAGE:hi * PAGE] = img
        src[lo * PAGE:hi * PAGE] = img
        for page in rng.choice(96, 30, replace=False):
            at = int(page) * PAGE + int(rng.integers(0, PAGE))
            src[at] = int(rng.integers(0, 2)) * int(rng.integers(1, 256))   # a write, maybe of a zero
        dst_backed = int(rng.integers(0, 97)) * PAGE      # the child's resident prefix: any hint
        pages.copy_changed(native, _addr(dst), _addr(src), n, (lo * PAGE, hi * PAGE), 0, dst_backed)
        assert dst[:] == src[:]


def test_copy_changed_with_a_resident_hint_is_exact():
    """The `backed` hint (a prefix known resident: read without asking pagemap) changes what is
    read, never the copy: exact for any hint, over pages backed or not."""
    native = get_native()
    rng = np.random.default_rng(11)
    n = 64 * PAGE
    for backed in (0, 7 * PAGE, 32 * PAGE + 5, n, 10 * n):
        src, dst = mmap.mmap(-1, n), mmap.mmap(-1, n)
        for page in rng.choice(64, 20, replace=False):
            src[int(page) * PAGE + int(rng.integers(0, PAGE))] = int(rng.integers(1, 256))
        written = pages.copy_changed(native, _addr(dst), _addr(src), n, (0, 0), backed)
        assert dst[:] == src[:] and written == 20


def test_a_sequence_makes_no_wasmtime_object_until_asked_and_its_views_close_with_it(rt):
    """Spawn, a step and a fork make no wasmtime-py object (the slot owns its Store); `store`,
    `memory` and `instance` are views made on first use: closing the view frees nothing, closing
    the sequence closes the view."""
    ctrl = rt.load(module())
    seq = rt.new_request(ctrl).spawn()
    assert rt.submit([StepInput(seq, [1, 2])]).wait().results[0].status == "ok"
    child = seq.fork()
    assert seq._views is None and child._views is None
    store, memory = seq.store, seq.memory
    assert seq.instance is not None and memory.data_len(store) == memory_bytes(child).__len__()
    store.close()   # a borrowed view: the sequence's Store lives on
    assert rt.submit([StepInput(seq, [1, 2, 3]), StepInput(child, [1, 2, 4])]).wait().results[0].status == "ok"
    view, child_memory = child.store, child.memory
    child.close()
    with pytest.raises(ValueError, match="closed"):
        child_memory.size(view)
    assert child.store is None and child.memory is None and child.instance is None


def test_a_reused_slot_is_known_resident_and_forks_from_it_exactly(make_rt):
    """With freed slots keeping memory resident (Limits.resident_bytes > 0), a sequence in a slot
    a freed one kept resident knows how much (ResidentSlots.taken), and a fork of it, which reads
    that prefix without asking pagemap, is exact."""
    rt = make_rt(resident_bytes=64 * MIB)
    ctrl = rt.load(module())
    req = rt.new_request(ctrl)
    first = req.spawn()
    first.memory.grow(first.store, 16)
    first.close()                                    # freed: wasmtime keeps its first 1 MiB resident
    parent = req.spawn()
    assert parent.slot.resident_bytes == min(MIB, 16 * WASM_PAGE + memory_bytes(parent).__len__())
    parent.memory.grow(parent.store, 16)
    parent.memory.write(parent.store, b"written", 3 * WASM_PAGE + 11)
    child = parent.fork()
    assert memory_bytes(child) == memory_bytes(parent)


@pytest.mark.parametrize("resident", [0, 64 * MIB])
def test_fork_copies_memory_exactly_into_a_reused_slot(make_rt, resident):
    """Scattered writes, a cleared data byte, grown pages: the child's memory equals the parent's
    byte for byte, also in a slot an earlier child wrote elsewhere (it was reset, not copied over);
    whether freed slots keep memory resident or give it back."""
    rt = make_rt(resident_bytes=resident)
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


def test_by_default_a_freed_slot_keeps_nothing_and_a_fork_copies_what_the_parent_wrote(rt):
    """Limits.resident_bytes 0 (the default): a freed slot's memory goes back to the kernel, so
    the next instance in it knows nothing resident, and its fork writes exactly the pages the
    parent wrote (pagemap tells them apart from the rest: no zero page is read or copied)."""
    if not Path("/proc/self/pagemap").exists():
        pytest.skip("pagemap (Linux)")
    ctrl = rt.load(module())
    req = rt.new_request(ctrl)
    first = req.spawn()
    first.memory.grow(first.store, 16)
    first.memory.write(first.store, b"\1" * (16 * WASM_PAGE), WASM_PAGE)   # 1 MiB written
    first.close()
    assert rt.registry.resident.held_bytes == 0
    parent = req.spawn()                               # the freed slot again (the only one free)
    assert parent.slot.resident_bytes == 0
    parent.memory.grow(parent.store, 16)
    for at in (2 * WASM_PAGE + 5, 9 * WASM_PAGE, 9 * WASM_PAGE + PAGE):   # three pages past the image
        parent.memory.write(parent.store, b"x", at)
    child = req.spawn()
    written = fork_copy(rt.native, child._plan, parent.slot, child.slot)
    assert memory_bytes(child) == memory_bytes(parent)
    image = child._plan.image
    assert image is not None and image[1] <= 2 * WASM_PAGE
    assert written == 3


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


# -- memory that goes back -----------------------------------------------------------------------
BURST = 48


def _burst(runtime):
    """BURST live sequences of 1 MiB + 128 KiB of linear memory each, the first 1 MiB written
    (wasmtime keeps 1 MiB of each freed one resident, zeroed); returns them."""
    ctrl = runtime.load(module())
    seqs = [runtime.new_request(ctrl).spawn() for _ in range(BURST)]
    for s in seqs:
        s.memory.grow(s.store, 16)
        s.memory.write(s.store, b"\1" * MIB, 4096)
    return seqs


def _resident_runtime(**limits):
    return aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, limits=aicirt.Limits(**limits))


def test_freed_slots_hold_memory_until_trimmed_and_then_give_it_back():
    rt = _resident_runtime(resident_bytes=1 << 30, resident_idle_s=3600)
    try:
        seqs = _burst(rt)
        for s in seqs:
            s.close()
        resident = rt.registry.resident
        assert resident.held_bytes == BURST * MIB
        held = rss_bytes()
        assert resident.trim() == BURST * MIB
        assert resident.held_bytes == 0
        assert held - rss_bytes() > BURST * MIB // 2
    finally:
        rt.close()


def test_the_resident_budget_bounds_what_freed_slots_hold():
    rt = _resident_runtime(resident_bytes=4 * MIB, resident_idle_s=3600)
    try:
        seqs = _burst(rt)
        busy = rss_bytes()
        for s in seqs:
            s.close()
        resident = rt.registry.resident
        assert resident.held_bytes <= 4 * MIB
        assert resident.given_back_bytes >= (BURST - 4) * MIB
        assert busy - rss_bytes() > BURST * MIB // 2       # what the burst wrote went back at close
    finally:
        rt.close()


def test_an_idle_runtime_gives_everything_back_after_every_burst():
    """Idle after each of two bursts, the runtime gives back all that freed slots hold (the idle
    thread, asleep after the first give-back, is woken by the next burst's frees: it used to
    sleep its minute out)."""
    rt = _resident_runtime(resident_bytes=1 << 30, resident_idle_s=0.05)
    try:
        resident = rt.registry.resident
        for burst in (1, 2):
            seqs = _burst(rt)
            busy = rss_bytes()
            for s in seqs:
                s.close()
            deadline = time.monotonic() + 30      # generous: a loaded machine may starve the idle thread
            while resident.held_bytes and time.monotonic() < deadline:
                time.sleep(0.05)
            assert resident.held_bytes == 0, f"burst {burst}: not given back"
            assert resident.given_back_bytes == burst * BURST * MIB
            assert busy - rss_bytes() > BURST * MIB // 2
    finally:
        rt.close()


def test_idle_trim_runs_with_the_default_resident_budget(make_rt, monkeypatch):
    """With Limits.resident_bytes 0 (the default: freed slots keep nothing) the runtime still
    trims the C heap once idle after instances were freed (it used to never run: nothing was held,
    so the idle thread never started), once per idle period, and not again until more are freed."""
    from aicirt.core import memory

    trims = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda pad: trims.append(pad) or 1)
    rt = make_rt(resident_idle_s=0.05)
    assert rt.limits.resident_bytes == 0
    resident = rt.registry.resident
    ctrl = rt.load(module())

    def burst_then_idle(expected: int) -> None:
        for s in [rt.new_request(ctrl).spawn() for _ in range(4)]:
            s.close()
        deadline = time.monotonic() + 30      # generous: a loaded machine may starve the idle thread
        while resident.heap_trims < expected and time.monotonic() < deadline:
            time.sleep(0.02)
        assert resident.heap_trims == expected and resident.held_bytes == 0

    burst_then_idle(1)
    time.sleep(0.2)                           # idle on: nothing freed, so no second trim
    # `trims` is process-wide: another test's runtime, still idling down, may trim too; this
    # runtime's own count is `heap_trims`
    assert resident.heap_trims == 1 and 0 in trims
    burst_then_idle(2)


def test_a_trimmed_slot_serves_its_next_instance_as_new(make_rt):
    """Given back, a slot still starts its next instance from the module's image and zeros, and
    runs it and its forks correctly."""
    rt = make_rt(resident_bytes=64 * MIB)
    ctrl = rt.load(module())
    seqs = [rt.new_request(ctrl).spawn() for _ in range(8)]
    fresh = memory_bytes(seqs[0])
    for s in seqs:
        s.memory.grow(s.store, 4)
        s.memory.write(s.store, b"left behind", 1100)
        s.memory.write(s.store, b"left behind", 3 * WASM_PAGE)
        s.close()
    assert rt.registry.resident.trim() > 0
    again = [rt.new_request(ctrl).spawn() for _ in range(8)]
    for s in again:
        assert memory_bytes(s) == fresh
        out = rt.submit([StepInput(s, [1])]).wait().results[0]
        assert out.status == "ok"
        assert memory_bytes(s.fork()) == memory_bytes(s)


def test_nothing_is_given_back_while_paused():
    slots = ResidentSlots(0, 3600.0, MIB)
    buf = mmap.mmap(-1, MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # as wasmtime's slots
    buf[:] = b"\1" * MIB
    with slots.lock:
        slots.budget_bytes = 1 << 30
        slots.freed(_addr(buf), MIB)
    with slots.paused():
        assert slots.trim() == 0
        assert buf[MIB - 1] == 1
    assert slots.trim() == MIB
    assert buf[:] == b"\0" * MIB       # an anonymous page given back reads as zero
    slots.close()
    slots.close()                        # idempotent


def test_resident_settings_are_validated():
    with pytest.raises(ValueError, match="resident_bytes"):
        aicirt.Limits(resident_bytes=-1)
    with pytest.raises(ValueError, match="resident_idle_s"):
        aicirt.Limits(resident_idle_s=0)
    with pytest.raises(ValueError, match="idle"):
        ResidentSlots(0, 0.0, MIB)
    with pytest.raises(ValueError, match="budget"):
        ResidentSlots(-1, 1.0, MIB)


def test_the_server_shows_what_freed_slots_hold_and_its_resident_budget(tmp_path, scripted_wasm):
    """/metrics has aicirt_resident_slot_bytes (a finished request's slot is held), /v1/config the
    two settings; an operator sets them like any limit."""
    import fastapi  # noqa: F401  (the dev extra)
    import re

    import httpx
    from _server_helpers import aici_run, live_server

    from aicirt.engine.backends import load_backend
    from aicirt.serve.settings import Settings

    settings = Settings(store=str(tmp_path), max_context=256,
                        limits=aicirt.Limits(resident_bytes=8 * MIB, resident_idle_s=3600))
    with live_server(settings, backend=load_backend("scripted")) as (url, server):
        mid = httpx.post(url + "/v1/controllers", content=scripted_wasm.read_bytes()).json()["module_id"]
        aici_run(url, {"controller": mid, "controller_arg": "", "prompt": "Go: ", "max_tokens": 2})
        held = server.runtime.registry.resident.held_bytes
        assert 0 < held <= 8 * MIB
        text = httpx.get(url + "/metrics").text
        assert re.search(rf"^aicirt_resident_slot_bytes {held}(\.0)?$", text, re.M), text
        limits = httpx.get(url + "/v1/config").json()["limits"]
        assert (limits["resident_bytes"], limits["resident_idle_s"]) == (8 * MIB, 3600)


def test_large_freed_buffers_go_back_to_the_os():
    """glibc raises its mmap and trim thresholds after a large free unless they are fixed: the
    next large buffer then comes from the heap and stays resident once freed (the variable
    floods' RSS growth). `aicirt serve` fixes them (memory.pin_malloc_thresholds)."""
    import ctypes

    from aicirt.core import memory
    if not memory.pin_malloc_thresholds():
        pytest.skip("not glibc on Linux, or the thresholds were set by the user")
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    first = libc.malloc(24 * MIB)
    ctypes.memset(first, 1, 24 * MIB)
    libc.free(first)                       # unfixed, this would raise the thresholds to 24 and 48 MiB
    before = rss_bytes()
    second = libc.malloc(16 * MIB)
    ctypes.memset(second, 1, 16 * MIB)
    libc.free(second)
    assert rss_bytes() - before < 8 * MIB


def test_a_slot_reused_by_a_smaller_instance_gives_back_what_a_larger_one_kept():
    """wasmtime resets only the memory a slot's last instance could reach: after a 1 MiB instance,
    a slot reused by a 128 KiB one still holds the first one's zeroed MiB. Giving back the last
    instance's memory alone left that resident for good (the soak's slow RSS growth: 0.5 MiB more
    in every slot that changed hands); the slot's whole extent goes back."""
    n = 32
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, max_sequences=n,
                        limits=aicirt.Limits(resident_bytes=1 << 30, resident_idle_s=3600))
    try:
        big = rt.load(module())
        seqs = [rt.new_request(big).spawn() for _ in range(n)]
        for s in seqs:
            s.memory.grow(s.store, 16)
            s.memory.write(s.store, b"\1" * MIB, 4096)
            s.close()
        small = rt.load(module(memory="2 2"))             # another module: it takes the same slots
        seqs = [rt.new_request(small).spawn() for _ in range(n)]
        assert all(s.memory.data_len(s.store) == 2 * WASM_PAGE for s in seqs)
        for s in seqs:
            s.close()
        resident = rt.registry.resident
        assert resident.held_bytes >= n * MIB
        held = rss_bytes()
        assert resident.trim() >= n * MIB
        assert held - rss_bytes() > n * MIB // 2
    finally:
        rt.close()


_ARENAS_CHILD = r"""
import ctypes, os, sys, threading
from aicirt.core import memory
capped = memory.cap_malloc_arenas() if sys.argv[1] == "cap" else False
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
held, go = [], threading.Barrier(8)
def work():
    go.wait()                               # all at once: each would get an arena of its own
    held.extend(libc.malloc(4096) for _ in range(200))
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
f = libc.fopen(sys.argv[2].encode(), b"w")
libc.malloc_info(0, f)
libc.fclose(f)
print(capped, open(sys.argv[2]).read().count("<heap nr="))
"""


@pytest.mark.parametrize("cap", ["cap", "default"])
def test_capped_arenas_make_the_threads_share_one(cap, tmp_path):
    """memory.cap_malloc_arenas (what `aicirt serve` does): threads that malloc at once share the
    main arena instead of each taking its own (scattered long-lived chunks over many arenas kept
    the soak's pages resident). In a child process: the cap is process-wide."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", _ARENAS_CHILD, cap, str(tmp_path / "info.xml")], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    if cap == "cap" and out[0] != "True":
        pytest.skip("not glibc on Linux")
    heaps = int(out[1])
    assert heaps == 1 if cap == "cap" else heaps > 1
