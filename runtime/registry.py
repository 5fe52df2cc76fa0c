"""The runtime's registry of live sequences, in one place with one owner.

It keeps, for one Runtime:
- every live sequence by index (the integer the rows API addresses it by) and by slot address
  (the host imports find theirs from the worker thread), with a table of slot addresses that a
  batch gathers its rows from in one hot-path call;
- the calls that outlive their batch (late, or closed while running): their mask arrays are
  pinned, and a sequence closed while its call runs is freed once the call has ended;
- the alternating mask arrays batches write into, and the batches' scratch arrays;
- what freed pooled slots keep resident (:class:`ResidentSlots`): bounded, given back when idle.

Sequences and batches call only the methods below; all of it is touched on the engine's thread,
except `lookup`, which worker threads call under the lock, and the resident slots, which have
their own lock and idle thread.
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
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from .native import ScratchBuffers

if TYPE_CHECKING:
    from .sequence import Sequence


_NONE_PINNED: frozenset[int] = frozenset()


class MaskBuffers:
    """Two alternating mask arrays, reused so steady-state steps write to resident pages (a fresh
    array costs a page fault per 4 KiB on first write: ~10 µs p99 per sequence-step at 151k).

    An outcome's `masks` therefore stays valid until the next-but-one submit. A buffer that a
    late call may still write into is never reused. Rows no branch refers to hold stale data."""

    def __init__(self, words: int) -> None:
        self.words = words
        self.buffers: list[np.ndarray | None] = [None, None]
        self.views: list[np.ndarray | None] = [None, None]   # each buffer's last view: the same rows, the same view
        self.turn = 0

    def take(self, rows: int, pinned: "set[int] | frozenset[int]") -> np.ndarray:
        turn = self.turn = self.turn ^ 1
        buf = self.buffers[turn]
        if buf is None or buf.shape[0] < rows or id(buf) in pinned:
            buf = self.buffers[turn] = np.empty((max(rows, 8), self.words), dtype=np.uint32)
        view = self.views[turn]
        if view is None or view.base is not buf or len(view) != rows:
            view = self.views[turn] = buf[:rows]
        return view


class Registry:
    """Live sequences, calls out past their batch, and mask arrays (see the module docstring)."""

    def __init__(self, mask_words: int, gather: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, int]],
                 resident: "ResidentSlots | None" = None) -> None:
        self._gather = gather   # the hot path's table[index] with a check of every index
        #: what freed pooled slots keep resident (Limits.resident_bytes); closed by `clear`
        self.resident = resident if resident is not None else ResidentSlots(0, 1.0, 0)
        self._lock = threading.Lock()
        self._by_addr: dict[int, Sequence] = {}
        self._by_index: list[Sequence | None] = []
        self._free: list[int] = []
        self.table = np.zeros(64, dtype=np.uint64)    # index -> slot address (0: free)
        self._held: dict[Sequence, np.ndarray] = {}    # calls out past their batch -> the mask array they write
        self._closing: list[Sequence] = []             # closed while their call was out
        self.masks = MaskBuffers(mask_words)
        #: the batches' per-row arrays (RowScratch), reused per batch size as the masks are
        self.scratch = ScratchBuffers()

    # -- sequences ------------------------------------------------------------------------------
    def add(self, seq: Sequence, addr: int) -> int:
        """Register `seq` (its slot at `addr`); returns its index."""
        with self._lock:
            index = self._free.pop() if self._free else len(self._by_index)
            if index == len(self._by_index):
                self._by_index.append(None)
            if index >= len(self.table):
                self.table = np.concatenate([self.table, np.zeros(len(self.table), dtype=np.uint64)])
            self._by_index[index] = seq
            self._by_addr[addr] = seq
            self.table[index] = addr
            return index

    def remove(self, seq: Sequence, addr: int) -> None:
        with self._lock:
            if self._by_addr.pop(addr, None) is not None:
                self._by_index[seq.index] = None
                self.table[seq.index] = 0
                self._free.append(seq.index)
            self._held.pop(seq, None)

    def swap_slots(self, a: Sequence, b: Sequence, addr_a: int, addr_b: int) -> None:
        """`a` and `b` exchange their native slots (at `addr_a`, `addr_b`), each keeping its index
        (speculate.py's commit: a sequence takes its fork's state)."""
        with self._lock:
            self._by_addr[addr_b], self._by_addr[addr_a] = a, b
            self.table[a.index], self.table[b.index] = addr_b, addr_a

    def lookup(self, addr: int) -> Sequence:
        """The sequence whose slot is at `addr` (host imports, on a worker thread). Raises KeyError."""
        with self._lock:
            return self._by_addr[addr]

    def at(self, index: int) -> Sequence:
        seq = self._by_index[index]
        assert seq is not None   # ptrs() refused free indices
        return seq

    def ptrs(self, index: np.ndarray) -> np.ndarray:
        """The slot addresses of the sequences at `index` (int array). Raises ValueError for an
        index that is no live sequence of this runtime (closed, or never one)."""
        ptrs, bad_row = self._gather(self.table, index)
        if bad_row >= 0:
            bad = int(index[bad_row])
            if 0 <= bad < len(self._by_index):
                raise ValueError(f"sequence at index {bad} is closed")
            raise ValueError(f"row index {bad} is not a sequence of this runtime")
        return ptrs

    def __len__(self) -> int:
        return len(self._by_addr)

    # -- calls that outlive their batch ---------------------------------------------------------
    def hold(self, seq: Sequence, masks: np.ndarray) -> None:
        """`seq`'s call outlives its batch and writes into `masks`: pin that array."""
        self._held[seq] = masks

    def unhold(self, seq: Sequence) -> None:
        self._held.pop(seq, None)

    @property
    def calls_out(self) -> int:
        """Calls still out past their batch (late, or closed while running)."""
        return len(self._held)

    def closing(self, seq: Sequence) -> None:
        """`seq` was closed while its call is out: free it once the call ends (`reap`)."""
        self._closing.append(seq)

    @property
    def closing_count(self) -> int:
        return len(self._closing)

    def reap(self) -> "list[Sequence] | tuple[()]":
        """The closing sequences whose calls have ended (the caller frees them)."""
        if not self._closing:
            return ()
        done = [s for s in self._closing if s.slot.done]
        if done:
            self._closing = [s for s in self._closing if not s.slot.done]
        return done

    def take_masks(self, rows: int) -> np.ndarray:
        """A mask array for a batch of `rows` (never one a call out may still write into)."""
        return self.masks.take(rows, self.pinned_buffers() if self._held else _NONE_PINNED)

    def pinned_buffers(self) -> set[int]:
        """The mask arrays calls still out may write into (by id)."""
        return {id(m.base if m.base is not None else m) for m in self._held.values()}

    def clear(self) -> list[Sequence]:
        """Forget everything (the runtime is closing); returns the sequences still registered."""
        with self._lock:
            seqs = list(self._by_addr.values())
            self._closing.clear()
            self._held.clear()
        self.resident.close()
        return seqs


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
      which `aicirt serve` applies to its process, and an embedding host may). One daemon thread does this; while freed
      slots hold nothing it sleeps until a slot is freed (waking once a minute at most, to notice a
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
        kept = min(memory_bytes, self.keep_resident)
        held = max(kept, self._extent.get(base, 0))
        if held <= 0 or self._closed:
            return
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
        if not self._held:
            self._asleep = True
            return None
        wait = self._last_activity + self.idle_s - time.monotonic()
        if wait > 0 or self._paused:
            return max(wait, self.idle_s / 4)
        self._trim_locked(0)
        if _malloc_trim is not None:
            _malloc_trim(0)   # the heap's free pages (a burst's Stores, logs, variables)
        self._asleep = True   # nothing held now: the next `freed` wakes the thread
        return None

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
