"""The wasmtime Engine of a Runtime: epoch interruption, stack limit, pooling allocator, and where
each slot's linear memory sits in the address space (`MemoryLayout`: what compiled code depends on)."""
from __future__ import annotations

import resource
import threading
import weakref
from dataclasses import dataclass

import wasmtime
from wasmtime import _ffi as wt_ffi

# The most of its linear memory a freed pooled slot keeps resident (zeroed, or reset to the
# module's image) for its next instance; what a Runtime's slots keep is slot_keep_resident's.
# 4 MiB left 1,000 closed sequences holding 4 GB.
KEEP_RESIDENT = 1 << 20

# A slot that reserves the whole 32-bit index space (plus a guard past it for constant offsets)
# needs no bounds check on a load or store: compiled code is that much smaller and faster (the
# json controller's masks: docs/embedding.md, "Address space, not memory"). It costs address
# space only (PROT_NONE, nothing committed): 4 GiB a slot, 4 TiB for a Runtime of 1,024 slots,
# out of x86-64's 128 TiB. A process's engines together reserve at most UNCHECKED_BUDGET so;
# past it (or under an address-space rlimit it would not fit) an engine reserves only the
# memory limit and its code checks every access, as every engine did before.
UNCHECKED_RESERVATION = 4 << 30
UNCHECKED_GUARD = 32 << 20
CHECKED_GUARD = 2 << 20
UNCHECKED_BUDGET = 48 << 40


@dataclass(frozen=True)
class MemoryLayout:
    """A slot's linear memory reservation and the guard after it (bytes)."""
    reservation: int
    guard: int

    @property
    def checked(self) -> bool:
        """Whether compiled code bounds-checks its memory accesses (a reservation under 4 GiB)."""
        return self.reservation < UNCHECKED_RESERVATION

    @property
    def key(self) -> str:
        return f"res{self.reservation}-guard{self.guard}"

    @staticmethod
    def bounded(memory_bytes: int) -> "MemoryLayout":
        return MemoryLayout(memory_bytes, CHECKED_GUARD)


UNCHECKED = MemoryLayout(UNCHECKED_RESERVATION, UNCHECKED_GUARD)
_reserved = 0                       # bytes the live unchecked engines of this process reserve
_reserved_lock = threading.Lock()
_layouts: "weakref.WeakKeyDictionary[wasmtime.Engine, MemoryLayout]" = weakref.WeakKeyDictionary()


def slot_keep_resident(resident_bytes: int, memory_bytes: int) -> int:
    """Bytes of a freed slot's linear memory wasmtime keeps resident: KEEP_RESIDENT, no more than
    the memory limit or the whole budget of freed slots (Limits.resident_bytes; 0: none, and a
    freed slot's memory goes back to the kernel at once, madvise)."""
    return max(0, min(KEEP_RESIDENT, resident_bytes, memory_bytes))


def make_engine(stack_bytes: int, memory_bytes: int, slots: int, keep_resident: int = 0) -> wasmtime.Engine:
    """An engine for `slots` instances of at most `memory_bytes` of linear memory each, whose
    freed slots keep `keep_resident` bytes resident (see slot_keep_resident); unchecked memory
    accesses where the address space allows (see UNCHECKED_BUDGET; `engine_layout` says which)."""
    want = slots * (UNCHECKED.reservation + UNCHECKED.guard)
    if _take_address_space(want):
        try:
            engine = _engine(stack_bytes, memory_bytes, slots, keep_resident, UNCHECKED)
        except Exception:   # the reservation did not fit after all (an rlimit, a crowded address space)
            _give_address_space(want)
        else:
            weakref.finalize(engine, _give_address_space, want)
            return engine
    return _engine(stack_bytes, memory_bytes, slots, keep_resident, MemoryLayout.bounded(memory_bytes))


def engine_layout(engine: wasmtime.Engine) -> MemoryLayout | None:
    """The layout `make_engine` gave `engine` (None: an engine made elsewhere)."""
    return _layouts.get(engine)


def _take_address_space(want: int) -> bool:
    global _reserved
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    budget = UNCHECKED_BUDGET if soft == resource.RLIM_INFINITY else min(UNCHECKED_BUDGET, soft // 4)
    with _reserved_lock:
        if _reserved + want > budget:
            return False
        _reserved += want
        return True


def _give_address_space(n: int) -> None:
    global _reserved
    with _reserved_lock:
        _reserved -= n


def _engine(stack_bytes: int, memory_bytes: int, slots: int, keep_resident: int,
            layout: MemoryLayout) -> wasmtime.Engine:
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True
    cfg.max_wasm_stack = stack_bytes
    _enable_pooling(cfg, slots, memory_bytes, keep_resident, layout)
    engine = wasmtime.Engine(cfg)
    _layouts[engine] = layout
    return engine


def _enable_pooling(cfg: wasmtime.Config, slots: int, memory_bytes: int, keep_resident: int,
                    layout: MemoryLayout) -> None:
    """Pooling instance allocator (not exposed by wasmtime-py's Config, so set through its C API):
    instances and memories come from preallocated slots instead of fresh mmaps, each slot
    `layout`'s reservation and guard (the memory limit itself, `memory_bytes`, is the pool's)."""
    cfg.memory_reservation = layout.reservation
    cfg.memory_guard_size = layout.guard
    pc = wt_ffi.wasmtime_pooling_allocation_config_new()
    wt_ffi.wasmtime_pooling_allocation_config_total_core_instances_set(pc, slots)
    wt_ffi.wasmtime_pooling_allocation_config_total_memories_set(pc, slots)
    wt_ffi.wasmtime_pooling_allocation_config_total_tables_set(pc, slots)
    wt_ffi.wasmtime_pooling_allocation_config_total_stacks_set(pc, 1)  # async fiber stacks: unused
    wt_ffi.wasmtime_pooling_allocation_config_max_memory_size_set(pc, memory_bytes)
    wt_ffi.wasmtime_pooling_allocation_config_linear_memory_keep_resident_set(pc, min(keep_resident, memory_bytes))
    wt_ffi.wasmtime_pooling_allocation_strategy_set(cfg.ptr(), pc)
    wt_ffi.wasmtime_pooling_allocation_config_delete(pc)
