"""Per-sequence wasmtime handles for the hot path: the Store's data pointer, raw handle copies
into the slot, and the state copy behind fork."""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import wasmtime
from wasmtime import _ffi as wt_ffi

from .types import CData

if TYPE_CHECKING:
    from . import Native


def context_addr(store: wasmtime.Store) -> int:
    return ctypes.cast(store._context(), ctypes.c_void_p).value or 0


def bind(native: "Native", slot: CData, store: wasmtime.Store) -> None:
    """Make `slot` the Store's data (host.c's imports find their sequence through it), and the
    data of the Store's epoch-deadline callback, which holds its calls to their limits in CPU
    time (step.c). The clock starts now, on this thread, under the first-call limit
    (`slot.first_call_ticks`), for a start function that runs while instantiating."""
    ctx = context_addr(store)
    slot.ctx = native.ffi.cast("void *", ctx)
    wt_ffi.wasmtime_context_set_data(store._context(), native.addr(slot))
    wt, store_ptr = native.wt, ctypes.cast(store.ptr(), ctypes.c_void_p).value or 0
    native.wtlib.wasmtime_store_epoch_deadline_callback(
        wt.cast("void *", store_ptr), wt.cast("wt_epoch_cb", native.epoch_callback),
        wt.cast("void *", native.addr(slot)), wt.NULL)
    slot.budget_us = slot.first_call_ticks * slot.tick_us
    native.clock_start(slot, slot.budget_us)


def bind_exports(native: "Native", slot: CData, funcs: dict, memory: wasmtime.Memory) -> None:
    """Point `slot` at one instance's functions and memory (raw handle copies)."""
    ffi = native.ffi
    for field, func in funcs.items():
        if func is not None:
            ffi.memmove(ffi.addressof(slot, field), bytes(func._func), ffi.sizeof("wt_func_t"))
    slot.has_post = funcs.get("f_post") is not None
    slot.needs_init = funcs.get("f_init") is not None   # _initialize runs on the worker, first
    ffi.memmove(ffi.addressof(slot, "mem"), bytes(memory._memory), ffi.sizeof("wt_memory_t"))


def _base(memory: wasmtime.Memory, store: wasmtime.Store) -> int:
    return ctypes.cast(memory.data_ptr(store), ctypes.c_void_p).value or 0


def copy_state(src: wasmtime.Store, src_memory: wasmtime.Memory, src_globals: dict,
               dst: wasmtime.Store, dst_memory: wasmtime.Memory, dst_globals: dict) -> None:
    """Fork's copy: linear memory and every mutable global (the loader exported them).
    Raises wasmtime.WasmtimeError if the copy cannot be made (e.g. memory cannot grow)."""
    grow = src_memory.size(src) - dst_memory.size(dst)
    if grow > 0:
        dst_memory.grow(dst, grow)
    ctypes.memmove(_base(dst_memory, dst), _base(src_memory, src), src_memory.data_len(src))
    # Raw value copies: the globals are numeric (the rewriter refuses others), and wasmtime-py's
    # Global.value/set_value cost ~10 µs each through Val objects.
    raw = wt_ffi.wasmtime_val_t()
    for idx, g in src_globals.items():
        wt_ffi.wasmtime_global_get(src._context(), ctypes.byref(g._global), ctypes.byref(raw))
        err = wt_ffi.wasmtime_global_set(dst._context(), ctypes.byref(dst_globals[idx]._global), ctypes.byref(raw))
        if err:
            raise wasmtime.WasmtimeError._from_ptr(err)
