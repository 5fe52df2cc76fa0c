"""Memory: what the runtime's sequences may hold together, and what goes back when they end.

- :class:`MemoryBudget`: a bound on the memory of all live sequences of a Runtime (their Wasm
  linear memory and the host's allocations for them), sized by default from the machine's memory
  (Limits.memory_budget_bytes); past it a new sequence waits or is refused with
  :class:`~aicirt.errors.OverBudget`, never another sequence harmed;
- :class:`ResidentSlots`: what freed pooled slots keep resident, bounded and given back when idle,
  with the C heap's free pages (malloc_trim), whatever `Limits.resident_bytes` is;
- the process-wide malloc policy `aicirt serve` applies (:func:`pin_malloc_thresholds`,
  :func:`cap_malloc_arenas`).
"""
from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from typing import Iterator

from ..errors import ControllerError


MIB = 1 << 20


# -- a budget for all live sequences ----------------------------------------------------------------
#: The share of the machine's memory (the smaller of physical memory and the cgroup's limit) a
#: Runtime's live sequences may reserve by default (Limits.memory_budget_bytes = 0).
DEFAULT_BUDGET_SHARE = 0.75


def machine_memory_bytes() -> int | None:
    """Physical memory, or the cgroup's memory limit where that is smaller (a container);
    None where neither can be read."""
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:     # "max" or a huge number: no limit
            sizes.append(int(text))
    return min(sizes) if sizes else None


def default_budget_bytes(per_sequence: int) -> int:
    """DEFAULT_BUDGET_SHARE of :func:`machine_memory_bytes` (at least one sequence's worth;
    64 GiB where the machine's memory cannot be read)."""
    machine = machine_memory_bytes()
    return max(per_sequence, int(machine * DEFAULT_BUDGET_SHARE) if machine else 64 << 30)


class OverBudget(ControllerError):
    """A new sequence would take the runtime's live sequences past their memory budget."""


class MemoryBudget:
    """The memory all live sequences of one Runtime may hold together, by reservation.

    Every sequence reserves what it may come to hold, `per_sequence_bytes`: its linear memory's
    limit (Limits.memory_bytes: a controller can grow to it within one call, faster than any
    watcher could stop it) and its native log (Limits.log_bytes). A new request's sequence
    (:meth:`reserve`) is refused with :class:`OverBudget` when the reservations would pass
    `limit_bytes`: nothing that already runs is touched, and a server keeps the request waiting
    (or answers 503 with Retry-After) until sequences end. A fork (:meth:`charge`) is never
    refused: its request was admitted and a fork is part of what it does (at most Limits.max_forks
    of them); it counts, so new requests wait the longer. Thread-safe.
    """

    def __init__(self, limit_bytes: int, per_sequence_bytes: int) -> None:
        if limit_bytes < 1 or per_sequence_bytes < 1:
            raise ValueError(f"a memory budget needs positive sizes, got {limit_bytes!r} and {per_sequence_bytes!r}")
        self.limit_bytes = limit_bytes
        self.per_sequence_bytes = per_sequence_bytes
        self._reserved = 0
        self._held = 0
        self._sequences = 0
        self._refused = 0
        self._lock = threading.Lock()

    @property
    def reserved_bytes(self) -> int:
        """What live sequences have reserved now."""
        return self._reserved

    @property
    def sequences(self) -> int:
        """Live sequences counted."""
        return self._sequences

    @property
    def refused(self) -> int:
        """New sequences refused so far."""
        return self._refused

    def room_for(self, sequences: int = 1) -> bool:
        """Whether `sequences` new sequences would fit now (a server asks before starting one)."""
        return self._reserved + sequences * self.per_sequence_bytes <= self.limit_bytes

    def reserve(self) -> int:
        """Reserve one new sequence's bytes; returns them. Raises OverBudget past the limit."""
        with self._lock:
            if self._reserved + self.per_sequence_bytes > self.limit_bytes:
                self._refused += 1
                raise OverBudget(
                    f"memory budget full: {self._sequences} live sequences hold "
                    f"{self._reserved / MIB:.0f} MiB of the {self.limit_bytes / MIB:.0f} MiB budget "
                    f"(Limits.memory_budget_bytes) and a new one reserves {self.per_sequence_bytes / MIB:.0f} MiB "
                    f"(Limits.memory_bytes + log_bytes); retry when sequences have ended")
            self._reserved += self.per_sequence_bytes
            self._sequences += 1
            return self.per_sequence_bytes

    def charge(self) -> int:
        """Count one fork's bytes (never refused); returns them."""
        with self._lock:
            self._reserved += self.per_sequence_bytes
            self._sequences += 1
            return self.per_sequence_bytes

    def hold(self, nbytes: int) -> bool:
        """Count `nbytes` held by something other than a live sequence (a prepared template,
        core/prepared.py) if they fit; returns whether they did (nothing is refused an error)."""
        with self._lock:
            if self._reserved + nbytes > self.limit_bytes:
                return False
            self._reserved += nbytes
            self._held += nbytes
            return True

    def unhold(self, nbytes: int) -> None:
        """Give back what :meth:`hold` counted."""
        with self._lock:
            self._reserved -= nbytes
            self._held -= nbytes

    @property
    def held_bytes(self) -> int:
        """What :meth:`hold` counts now (part of `reserved_bytes`)."""
        return self._held

    def release(self, nbytes: int) -> None:
        """A sequence that reserved or was charged `nbytes` ended."""
        if nbytes:
            with self._lock:
                self._reserved -= nbytes
                self._sequences -= 1


# -- memory that goes back --------------------------------------------------------------------------
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


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters
MALLOC_THRESHOLD = 1 << 20
_malloc_pinned: bool | None = None


def pin_malloc_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds at 1 MiB (once per process; glibc only; not where the
    user set either, by MALLOC_*_THRESHOLD_ or GLIBC_TUNABLES). By default both rise with the
    largest buffer freed (up to 32 and 64 MiB): after a flood of variables frees its 16 MiB
    buffer, later large buffers come from the threads' arenas, and an arena's free top is only
    given back once it passes the raised trim threshold, which malloc_trim does not change for
    the worker threads' arenas (about 60 MiB kept after a few floods, measured with
    bench/hostile_soak.py's mix). Fixed, a buffer of 1 MiB or more is its own mapping, gone at
    free, and an arena keeps at most 1 MiB of free top. Returns whether they are fixed.

    Process-wide, so the runtime never does it by itself: `aicirt serve` (a process it owns)
    and bench/hostile_soak.py call it; an engine that embeds the runtime (vLLM) decides for its
    own process, since every buffer of 1 MiB or more then costs a fresh mapping and its page
    faults (a CPU forward pass's activations among them)."""
    global _malloc_pinned
    if _malloc_pinned is None:
        _malloc_pinned = False
        tunables = os.environ.get("GLIBC_TUNABLES", "")
        user_set = any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")) \
            or "mmap_threshold" in tunables or "trim_threshold" in tunables
        mallopt = getattr(_libc, "mallopt", None) if _madvise is not None else None
        if mallopt is not None and not user_set:
            mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            _malloc_pinned = (mallopt(_M_MMAP_THRESHOLD, MALLOC_THRESHOLD) == 1
                              and mallopt(_M_TRIM_THRESHOLD, MALLOC_THRESHOLD) == 1)
    return _malloc_pinned


_M_ARENA_MAX = -8   # glibc's mallopt parameter
MALLOC_ARENAS = 1
_arenas_capped: bool | None = None


def cap_malloc_arenas() -> bool:
    """Cap glibc's malloc arenas at MALLOC_ARENAS (1: every thread shares the main thread's),
    once per process; glibc only; not where the user set MALLOC_ARENA_MAX or the
    glibc.malloc.arena_max tunable. By default glibc gives threads up to 8 arenas a core; the
    workers' calls (traps, logs, host-import buffers) then spread their few long-lived chunks
    over several arenas, each chunk keeping its page resident after the rest is freed, which
    malloc_trim cannot give back (bench/hostile_soak.py's full mix, 3,000 sequences after
    warm-up, one run each: RSS +5.0 MiB with the default arenas, +3.5 with two, +2.1 with one;
    the same CPU time, 80 s).
    The cost: threads that malloc at the same moment wait for the one arena's lock (the hot
    path mallocs little; an engine's own threads share it too). It bounds arenas made after the
    call, so call it before the threads start. Returns whether the cap is set.

    Process-wide, like :func:`pin_malloc_thresholds`, so the runtime never does it by itself:
    `aicirt serve` and bench/hostile_soak.py call it; a host that embeds the runtime decides."""
    global _arenas_capped
    if _arenas_capped is None:
        _arenas_capped = False
        user_set = "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", "")
        mallopt = getattr(_libc, "mallopt", None) if _madvise is not None else None
        if mallopt is not None and not user_set:
            mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            _arenas_capped = mallopt(_M_ARENA_MAX, MALLOC_ARENAS) == 1
    return _arenas_capped


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


_mallinfo2 = getattr(_libc, "mallinfo2", None) if _madvise is not None else None   # glibc >= 2.33
if _mallinfo2 is not None:
    _mallinfo2.restype = _MallInfo2


def heap_stats() -> dict[str, int] | None:
    """The C heap now (glibc's mallinfo2, all arenas), in bytes: `in_use` (allocated chunks: what
    a leak grows), `free` (free chunks inside the heap: what fragmentation keeps mapped; what
    malloc_trim can give back of it is whole free pages), `arena` (the heap's extent, sbrk'd and
    arena mappings), `mmapped` (chunks past the mmap threshold, each its own mapping). None
    where glibc's mallinfo2 is missing (musl, macOS, glibc < 2.33)."""
    if _mallinfo2 is None:
        return None
    m = _mallinfo2()
    return {"in_use": m.uordblks, "free": m.fordblks, "arena": m.arena, "mmapped": m.hblkhd}


def trim_heap() -> bool:
    """Give the C heap's free pages back to the OS now (glibc's malloc_trim(0): the top of every
    arena and the whole free pages inside them). Returns False where there is no malloc_trim."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def give_back(base: int, size: int) -> bool:
    """Drop the resident pages of [base, base + size) (`base` page-aligned, `size` bytes, rounded
    up to pages): they read as before (zeros, or the file they map) and leave RSS. False where
    the platform cannot (not Linux, where MADV_DONTNEED means "zero on next touch") or the
    kernel refused (e.g. not mapped)."""
    if _madvise is None or size <= 0:
        return False
    size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    return bool(_madvise(base, size, _MADV_DONTNEED) == 0)


class ResidentSlots:
    """What the freed pooled slots of one Runtime's engine keep resident, bounded and given back.

    wasmtime's pooling allocator zeroes the first `keep_resident` bytes of a freed slot's linear
    memory (engine_config.slot_keep_resident: 0 by default, and then this records nothing) and
    keeps them resident, so that the slot's next instance does not fault them in again (only what
    the last instance could reach: a slot a smaller instance reused still holds what a larger one
    kept, so a slot's record is the most any instance kept since it was last given back). Left
    alone, every slot ever used holds that much for good (up to max_sequences x 1 MiB after a
    burst). This records each freed slot by the base address of its memory, and

    * bounds what freed slots hold together by `budget_bytes` (Limits.resident_bytes): past it,
      the slots freed longest ago are given back at once;
    * gives back all of it once no instance was made or freed for `idle_s` seconds
      (Limits.resident_idle_s), and the C heap's free pages with it (glibc's malloc_trim: a
      burst's Stores, logs and variables are malloc'd; see also :func:`pin_malloc_thresholds`,
      which `aicirt serve` applies to its process, and an embedding host may). This holds with
      `budget_bytes` 0 too (Limits.resident_bytes' default: no slot keeps memory, but every freed
      instance leaves free heap pages). One daemon thread does this; while nothing was freed since
      the last trim it sleeps until a slot is freed (waking once a minute at most, to notice a
      ResidentSlots that was dropped unclosed), so an idle runtime has no ticking thread.

    Giving back is madvise(MADV_DONTNEED) over a free slot's reset memory: what it reads does not
    change (zeros, or the module's copy-on-write image, which the kernel maps back), only the
    pages leave RSS, and its next use faults them in again, so wasmtime's view of a reset slot
    stays true. A slot must not be given back while an instance holds it: every instantiation in
    the engine runs with :attr:`lock` held and records the slot with :meth:`taken` (a sequence's),
    or inside :meth:`paused` (a template instance at load, which does not record its slot), and
    every freeing of a recorded slot runs with the lock held and records it with :meth:`freed`.
    `pool` is the Engine, kept alive until :meth:`close`: giving back a range that was unmapped and
    reused would zero someone else's memory. Raises ValueError for a negative budget or a
    non-positive idle time.
    """

    def __init__(self, budget_bytes: int, idle_s: float, keep_resident: int, pool: object = None) -> None:
        if budget_bytes < 0:
            raise ValueError(f"resident budget must be >= 0 bytes, got {budget_bytes!r}")
        if not idle_s > 0:
            raise ValueError(f"resident idle time must be > 0 s, got {idle_s!r}")
        self.budget_bytes = budget_bytes
        self.idle_s = idle_s
        self.keep_resident = keep_resident
        self._pool = pool
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)      # the idle thread waits on it
        # base address -> (bytes held: the slot's extent, bytes its last instance kept), oldest first
        self._free: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._held = 0
        # base -> the prefix of the slot's memory that may be resident (bytes): the most that any
        # instance of it kept since it was last given back; kept while an instance holds the slot
        self._extent: dict[int, int] = {}
        self._given_back = 0
        self._paused = 0
        self._last_activity = time.monotonic()
        self._closed = False
        self._dirty = False           # an instance was freed since the heap was last trimmed
        self._heap_trims = 0
        self._asleep = False          # the idle thread waits to be woken (it found nothing held)
        self._thread: threading.Thread | None = None

    # -- what instantiation and freeing record (with the lock held) ---------------------------------
    def taken(self, base: int) -> int:
        """An instance now holds the slot whose memory starts at `base`; returns the bytes of it
        that were kept resident (0 if none are known to be: a fresh slot, or one given back)."""
        record = self._free.pop(base, None)
        if record is not None:
            self._held -= record[0]
        self._last_activity = time.monotonic()
        return record[1] if record is not None else 0

    def freed(self, base: int, memory_bytes: int) -> None:
        """The slot at `base` was freed (its Store closed) with `memory_bytes` of linear memory:
        wasmtime keeps min(that, keep_resident) of it, zeroed, and what an earlier, larger
        instance of the slot kept past `memory_bytes` stays resident too: wasmtime resets only the
        memory the last instance could reach, so the slot holds the largest of these since it was
        last given back (its extent). Past the budget, the oldest go back now."""
        self._last_activity = time.monotonic()
        if self._closed:
            return
        self._dirty = True    # the instance's Store, logs and buffers went back to the C heap
        kept = min(memory_bytes, self.keep_resident)
        held = max(kept, self._extent.get(base, 0))
        if held > 0:
            self._extent[base] = held
            self._held += held - self._free.pop(base, (0, 0))[0]
            self._free[base] = (held, kept)
            if self._held > self.budget_bytes:
                self._trim_locked(self.budget_bytes)
        if self._thread is None:
            self._thread = threading.Thread(target=_watch_idle, args=(weakref.ref(self), self._wake),
                                            daemon=True, name="aicirt-resident")
            self._thread.start()
        elif self._asleep:
            self._asleep = False
            self._wake.notify()       # the idle thread was asleep with nothing to watch (at most once an idle period)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing is given back while the block runs (it may instantiate in the engine without
        recording the slot: a free slot it takes stays recorded as free, safely, once it is free
        again). Waits for a give-back in progress to end."""
        with self.lock:
            self._paused += 1
        try:
            yield
        finally:
            with self.lock:
                self._paused -= 1
                self._last_activity = time.monotonic()

    # -- giving back ----------------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        """What freed slots hold resident now (bytes; an upper bound, from wasmtime's rule)."""
        return self._held

    @property
    def given_back_bytes(self) -> int:
        """Bytes given back so far (over budget, idle, or by :meth:`trim`)."""
        return self._given_back

    def trim(self, keep_bytes: int = 0) -> int:
        """Give back freed slots, oldest first, until they hold at most `keep_bytes`; returns the
        bytes given back (0 while :meth:`paused`). Thread-safe."""
        with self.lock:
            return self._trim_locked(keep_bytes)

    def _trim_locked(self, keep_bytes: int) -> int:
        if self._paused:
            return 0
        released = 0
        while self._held > keep_bytes and self._free:
            base, (held, _) = self._free.popitem(last=False)
            self._held -= held
            self._extent.pop(base, None)
            if give_back(base, held):
                released += held
        self._given_back += released
        return released

    def _idle_step(self) -> float | None:
        """With the lock held: give everything back if idle long enough; returns how long to wait
        before looking again (None: nothing held, wait to be woken)."""
        if self._closed:
            return None
        if not self._held and not self._dirty:
            self._asleep = True
            return None
        wait = self._last_activity + self.idle_s - time.monotonic()
        if wait > 0 or self._paused:
            return max(wait, self.idle_s / 4)
        self._trim_locked(0)
        if _malloc_trim is not None:
            _malloc_trim(0)   # the heap's free pages (a burst's Stores, logs, variables)
        self._dirty = False
        self._heap_trims += 1
        self._asleep = True   # nothing held now: the next `freed` wakes the thread
        return None

    @property
    def heap_trims(self) -> int:
        """How many idle periods ended with the C heap trimmed (malloc_trim where glibc has it)."""
        return self._heap_trims

    def close(self) -> None:
        """Stop the idle thread and forget the freed slots (idempotent): nothing is given back
        after this, so the engine may go; what freed slots hold goes with it."""
        with self.lock:
            self._closed = True
            self._free.clear()
            self._extent.clear()
            self._held = 0
            self._pool = None
            self._wake.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


def _watch_idle(ref: "weakref.ref[ResidentSlots]", wake: threading.Condition) -> None:
    """The idle thread: holds its ResidentSlots only while it looks, so an unclosed one can go."""
    with wake:
        while True:
            slots = ref()
            if slots is None or slots._closed:
                return
            wait = slots._idle_step()
            del slots
            wake.wait(wait if wait is not None else 60.0)   # woken by `freed`; 60 s: to notice a lost ResidentSlots

