"""The wasmtime Engine of a Runtime: epoch interruption, stack limit, pooling allocator."""
from __future__ import annotations

import wasmtime
from wasmtime import _ffi as wt_ffi

# Linear memory a pooled slot keeps resident when freed, reused by the slot's next instance: a
# fork's copy then lands on resident pages (1 MiB: ~0.8 ms into fresh pages, ~0.2 ms into resident
# ones, measured here). It bounds what a used slot holds: at most this much per slot, reused,
# never accumulated (4 MiB left 1,000 closed sequences holding 4 GB; 1 MiB forks as fast).
KEEP_RESIDENT = 1 << 20


def make_engine(stack_bytes: int, memory_bytes: int, slots: int) -> wasmtime.Engine:
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True
    cfg.max_wasm_stack = stack_bytes
    _enable_pooling(cfg, slots, memory_bytes)
    return wasmtime.Engine(cfg)


def _enable_pooling(cfg: wasmtime.Config, slots: int, memory_bytes: int) -> None:
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
    wt_ffi.wasmtime_pooling_allocation_config_linear_memory_keep_resident_set(pc, min(KEEP_RESIDENT, memory_bytes))
    wt_ffi.wasmtime_pooling_allocation_strategy_set(cfg.ptr(), pc)
    wt_ffi.wasmtime_pooling_allocation_config_delete(pc)
