"""Memory that goes back: what freed pooled slots keep resident, its budget, and the trim.

wasmtime's pooling allocator zeroes the first ``engine_config.KEEP_RESIDENT`` bytes of a freed
slot's linear memory and keeps them resident, so that the slot's next instance (and a fork's copy
into it) does not fault those pages in again. Left alone, every slot ever used holds that much
for good: up to ``max_sequences`` x 1 MiB after a burst. :class:`ResidentSlots` records each freed
slot (by the base address of its memory) and

* bounds what freed slots hold together by ``Limits.resident_bytes``: past it, the slots freed
  longest ago are given back at once;
* gives back everything freed slots hold once the runtime has made or freed no instance for
  ``Limits.resident_idle_s`` (a daemon thread checks a few times a period), and then also the
  free pages of the C heap (glibc's ``malloc_trim``): a burst's Stores, variables and logs are
  malloc'd, and glibc keeps what they freed. For the same reason a Runtime pins glibc's mmap
  threshold at its default (:func:`pin_mmap_threshold`), so that large freed buffers go back.

Giving back is ``madvise(MADV_DONTNEED)`` over the slot's reset memory: its contents do not change
(zeros, or the module's copy-on-write image, which the kernel maps back), only the pages leave
RSS, and the slot's next use faults them in again, so wasmtime's view of a reset slot stays true.
Only a slot that no instance holds is given back: instantiation, freeing and trimming all run
under :attr:`ResidentSlots.lock`. Linux only (elsewhere MADV_DONTNEED does not mean "zero on next
touch"): there the accounting runs and nothing is given back.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict

_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_madvise = _malloc_trim = None
if sys.platform.startswith("linux") and _MADV_DONTNEED is not None:
    _libc = ctypes.CDLL(None, use_errno=True)
    _madvise = _libc.madvise
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _madvise.restype = ctypes.c_int
    _malloc_trim = getattr(_libc, "malloc_trim", None)   # glibc; not musl
    if _malloc_trim is not None:
        _malloc_trim.argtypes = [ctypes.c_size_t]
        _malloc_trim.restype = ctypes.c_int

_M_MMAP_THRESHOLD = -3          # glibc's mallopt parameter
_MMAP_THRESHOLD = 128 << 10     # glibc's default, pinned
_pinned = False


def pin_mmap_threshold() -> bool:
    """Keep glibc's mmap threshold at its default (128 KiB) instead of letting it rise: by
    default, freeing one large mmapped buffer raises the threshold to that size (up to 32 MiB),
    after which large buffers (a flood of variables, a huge text to tokenize) come from the heap
    and stay there once freed, fragmenting it (+20 MiB RSS from a few variable floods, measured
    with bench/hostile_soak.py's mix). Pinned, each is its own mapping and goes back at free.
    Once per process, glibc only, and not where the user set the threshold (MALLOC_MMAP_THRESHOLD_
    or GLIBC_TUNABLES). Returns whether it is pinned."""
    global _pinned
    if _pinned:
        return True
    if _madvise is None or "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get(
            "GLIBC_TUNABLES", ""):
        return False
    mallopt = getattr(_libc, "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        _pinned = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1
    return _pinned


def give_back(base: int, size: int) -> bool:
    """Drop the resident pages of [base, base + size) (page-aligned base; size rounded up to
    pages): they read as before, as zeros or the mapped file, and leave RSS. False where the
    platform cannot (not Linux) or the kernel refused (e.g. not mapped)."""
    if _madvise is None or size <= 0:
        return False
    size = -(-size // _PAGE) * _PAGE
    return _madvise(base, size, _MADV_DONTNEED) == 0


class ResidentSlots:
    """Freed pooled slots that still hold resident memory, for one Runtime's engine.

    `budget_bytes` (>= 0) bounds what they hold together; `idle_s` (> 0) is how long the runtime
    must make and free no instance before all of it is given back; `keep_resident` is what
    wasmtime keeps of each freed slot (bytes); `pool` the Engine whose slots these are (kept
    alive until :meth:`close`). :meth:`taken` and :meth:`freed` must be called
    with :attr:`lock` held, together with the instantiation or the Store's close they record.
    Raises ValueError for a negative budget or a non-positive idle time.
    """

    def __init__(self, budget_bytes: int, idle_s: float, keep_resident: int, pool: object = None) -> None:
        if budget_bytes < 0:
            raise ValueError(f"resident budget must be >= 0 bytes, got {budget_bytes!r}")
        if not idle_s > 0:
            raise ValueError(f"resident idle time must be > 0 s, got {idle_s!r}")
        self.budget_bytes = budget_bytes
        self.idle_s = idle_s
        self.keep_resident = keep_resident
        # The pool's owner (the wasmtime Engine), held so that its slots stay mapped for as long as
        # a trim may touch them: madvise over an unmapped and reused range would zero live memory.
        self._pool = pool
        pin_mmap_threshold()
        self.lock = threading.Lock()
        self._free: OrderedDict[int, int] = OrderedDict()   # base address -> bytes held, oldest first
        self._held = 0
        self._given_back = 0
        self._last_activity = time.monotonic()
        self._active = False          # an instance made or freed since the last idle trim
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the runtime's sequences record (with the lock held) --------------------------------
    def taken(self, base: int) -> None:
        """An instance now holds the slot whose memory starts at `base`."""
        held = self._free.pop(base, None)
        if held is not None:
            self._held -= held
        self._last_activity = time.monotonic()
        self._active = True

    def freed(self, base: int, memory_bytes: int) -> None:
        """The slot at `base` was freed (its Store closed) with `memory_bytes` of linear memory:
        wasmtime keeps min(that, keep_resident) of it. Past the budget, the oldest go back now."""
        held = min(memory_bytes, self.keep_resident)
        self._last_activity = time.monotonic()
        self._active = True
        if held <= 0 or self._closed.is_set():
            return
        self._held += held - self._free.pop(base, 0)
        self._free[base] = held
        if self._held > self.budget_bytes:
            self._trim_locked(self.budget_bytes)
        self._start_idle_thread()

    # -- giving back -------------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        """What freed slots hold resident now (bytes, an upper bound: wasmtime's own estimate)."""
        return self._held

    @property
    def given_back_bytes(self) -> int:
        """Bytes given back so far (over budget or idle)."""
        return self._given_back

    def trim(self, keep_bytes: int = 0) -> int:
        """Give back freed slots, oldest first, until they hold at most `keep_bytes`; returns the
        bytes given back. Thread-safe."""
        with self.lock:
            return self._trim_locked(keep_bytes)

    def _trim_locked(self, keep_bytes: int) -> int:
        released = 0
        while self._held > keep_bytes and self._free:
            base, held = self._free.popitem(last=False)
            self._held -= held
            if give_back(base, held):
                released += held
        self._given_back += released
        return released

    def _trim_if_idle(self) -> None:
        with self.lock:
            if not (self._active and time.monotonic() - self._last_activity >= self.idle_s):
                return
            self._active = False
            self._trim_locked(0)
        if _malloc_trim is not None:
            _malloc_trim(0)

    def _start_idle_thread(self) -> None:
        if self._thread is None and not self._closed.is_set():
            self._thread = threading.Thread(target=_watch_idle, args=(weakref.ref(self), self._closed,
                                                                      max(0.02, self.idle_s / 4)),
                                            daemon=True, name="aicirt-resident")
            self._thread.start()

    def close(self) -> None:
        """Stop the idle watch and forget the freed slots (idempotent): nothing is given back
        after this, so the engine may go; what freed slots hold goes with it."""
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self.lock:
            self._free.clear()
            self._held = 0
            self._pool = None


def _watch_idle(ref: "weakref.ref[ResidentSlots]", closed: threading.Event, period_s: float) -> None:
    """The idle trim: every `period_s`, give everything back if the runtime has been idle."""
    while not closed.wait(period_s):
        slots = ref()
        if slots is None:
            return
        slots._trim_if_idle()
        del slots
