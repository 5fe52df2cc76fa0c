"""The wasmtime Engine of a Runtime: epoch interruption, stack limit, pooling allocator."""
from __future__ import annotations

import wasmtime
from wasmtime import _ffi as wt_ffi

# The most of its linear memory a freed pooled slot keeps resident (zeroed, or reset to the
# module's image) for its next instance; what a Runtime's slots keep is slot_keep_resident's.
# 4 MiB left 1,000 closed sequences holding 4 GB.
KEEP_RESIDENT = 1 << 20


def slot_keep_resident(resident_bytes: int, memory_bytes: int) -> int:
    """Bytes of a freed slot's linear memory wasmtime keeps resident: KEEP_RESIDENT, no more than
    the memory limit or the whole budget of freed slots (Limits.resident_bytes; 0: none, and a
    freed slot's memory goes back to the kernel at once, madvise)."""
    return max(0, min(KEEP_RESIDENT, resident_bytes, memory_bytes))


def make_engine(stack_bytes: int, memory_bytes: int, slots: int, keep_resident: int = 0) -> wasmtime.Engine:
    """An engine for `slots` instances of at most `memory_bytes` of linear memory each, whose
    freed slots keep `keep_resident` bytes resident (see slot_keep_resident)."""
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True
    cfg.max_wasm_stack = stack_bytes
    _enable_pooling(cfg, slots, memory_bytes, keep_resident)
    return wasmtime.Engine(cfg)


def _enable_pooling(cfg: wasmtime.Config, slots: int, memory_bytes: int, keep_resident: int) -> None:
    """Pooling instance allocator (not exposed by wasmtime-py's Config, so set through its C API):
    instances and memories come from preallocated slots instead of fresh mmaps.

    Each slot reserves only the memory limit plus a small guard (not wasmtime's default 4 GiB,
    which would reserve terabytes of address space per Runtime and run out after a few dozen
    runtimes); the price is explicit bounds checks in controller code."""
    cfg.memory_reservation = memory_bytes
    cfg.memory_guard_size = 2 << 20
    pc = wt_ffi.wasmtime_pooling_allocation_config_new()
    wt_ffi.wasmtime_pooling_allocation_config_total_core_instances_set(pc, slots)
    wt_ffi.wasmtime_pooling_allocation_config_total_memories_set(pc, slots)
    wt_ffi.wasmtime_pooling_allocation_config_total_tables_set(pc, slots)
    wt_ffi.wasmtime_pooling_allocation_config_total_stacks_set(pc, 1)  # async fiber stacks: unused
    wt_ffi.wasmtime_pooling_allocation_config_max_memory_size_set(pc, memory_bytes)
    wt_ffi.wasmtime_pooling_allocation_config_linear_memory_keep_resident_set(pc, min(keep_resident, memory_bytes))
    wt_ffi.wasmtime_pooling_allocation_strategy_set(cfg.ptr(), pc)
    wt_ffi.wasmtime_pooling_allocation_config_delete(pc)
