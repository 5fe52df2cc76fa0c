"""The runtime's registry of live sequences, in one place with one owner.

It keeps, for one Runtime:
- every live sequence by index (the integer the rows API addresses it by) and by slot address
  (the host imports find theirs from the worker thread), with a table of slot addresses that a
  batch gathers its rows from in one hot-path call;
- the calls that outlive their batch (late, or closed while running): their mask arrays are
  pinned, and a sequence closed while its call runs is freed once the call has ended;
- the alternating mask arrays batches write into, and the batches' scratch arrays;
- what freed pooled slots keep resident (:class:`ResidentSlots`, memory.py): bounded, given back when idle.

Sequences and batches call only the methods below; all of it is touched on the engine's thread,
except `lookup`, which worker threads call under the lock, and the resident slots, which have
their own lock and idle thread.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..native import ScratchBuffers

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
        view = self.views[turn]
        if not pinned and view is not None and len(view) == rows:   # a step like this buffer's last
            return view
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


# What freed slots keep resident, and the malloc policy, live in memory.py (re-exported here).
from .memory import ResidentSlots, cap_malloc_arenas, give_back, pin_malloc_thresholds  # noqa: E402,F401
