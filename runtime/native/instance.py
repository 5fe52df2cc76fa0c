"""Per-sequence wasmtime handles for the hot path: the Store's data pointer, instantiation with
raw handle copies into the slot, and the state copy behind fork."""
from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING, Any

import wasmtime
from wasmtime import _ffi as wt_ffi

from .. import abi
from . import pages
from .types import CData

if TYPE_CHECKING:
    from ..controller import Controller
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


class _Plan:
    """What every instance of one controller binds, worked out once: the exports' names (as C
    strings) and the slot field each function goes to, the memory's name, the mutable globals'."""

    def __init__(self, controller: "Controller") -> None:
        funcs = [("f_realloc", abi.EXPORT_REALLOC), ("f_mid", abi.EXPORT_MID_PROCESS)]
        if controller.has_post:
            funcs.append(("f_post", abi.EXPORT_POST))
        if controller.has_initialize:
            funcs.append(("f_init", abi.EXPORT_INITIALIZE))
        self.funcs = [(field, _c_name(name)) for field, name in funcs]
        self.memory = _c_name("memory")
        self.globals = [(idx, _c_name(name)) for idx, name in controller.globals.items()]
        self.has_post, self.has_init = controller.has_post, controller.has_initialize
        self.image: tuple[int, int] | None = None   # a fresh instance's nonzero pages (bytes), at the first fork


def _c_name(name: str) -> tuple[ctypes.Array, int]:
    data = name.encode()
    return ctypes.create_string_buffer(data), len(data)


_plans: "weakref.WeakKeyDictionary[Controller, _Plan]" = weakref.WeakKeyDictionary()
_instantiate_pre = wt_ffi.dll.wasmtime_instance_pre_instantiate   # argtypes set by wasmtime-py's bindings
_export_get = wt_ffi.dll.wasmtime_instance_export_get


def _export(ctx: Any, inst: Any, name: tuple[ctypes.Array, int], item: Any) -> Any:
    """Look the export `name` of `inst` up into `item` (a wasmtime_extern_t the caller holds);
    returns its union of handles, valid while `item` is."""
    if not _export_get(ctx, ctypes.byref(inst), name[0], name[1], ctypes.byref(item)):
        raise wasmtime.WasmtimeError(f"export {name[0].value.decode()!r} is missing")   # the loader checked
    return item.of


def instantiate(native: "Native", slot: CData, pre: wasmtime.InstancePre, store: wasmtime.Store,
                controller: "Controller") -> tuple[wasmtime.Instance, wasmtime.Memory, dict[int, wasmtime.Global]]:
    """A fresh instance of `controller` in `store` (whose data `slot` already is, see `bind`), with
    `slot` pointed at its functions and memory (raw handle copies); returns the instance, its
    memory and its mutable globals (by index, for fork). The few exports are looked up by name
    through the C API instead of wasmtime-py's export map, which wraps every export (2/3 of an
    instantiation's time). Each handle is copied out of the lookup's extern while that extern is
    alive: a handle read through the address of a temporary ctypes object is read from freed
    memory, which another thread may already have reused (see the commit that added this).
    Raises wasmtime.WasmtimeError or wasmtime.Trap if instantiation fails."""
    plan = _plans.get(controller)
    if plan is None:
        assert native.ffi.sizeof("wt_func_t") == _FUNC_BYTES and native.ffi.sizeof("wt_memory_t") == _MEMORY_BYTES
        plan = _plans[controller] = _Plan(controller)
    ctx = store._context()
    inst = wt_ffi.wasmtime_instance_t()
    trap = ctypes.POINTER(wt_ffi.wasm_trap_t)()
    err = _instantiate_pre(pre.ptr(), ctx, ctypes.byref(inst), ctypes.byref(trap))
    if err:
        raise wasmtime.WasmtimeError._from_ptr(err)
    if trap:
        raise wasmtime.Trap._from_ptr(trap)
    ffi, item = native.ffi, wt_ffi.wasmtime_extern_t()
    for field, name in plan.funcs:
        ffi.memmove(ffi.addressof(slot, field), bytes(_export(ctx, inst, name, item).func), _FUNC_BYTES)
    mem = wt_ffi.wasmtime_memory_t.from_buffer_copy(_export(ctx, inst, plan.memory, item).memory)
    ffi.memmove(ffi.addressof(slot, "mem"), bytes(mem), _MEMORY_BYTES)
    slot.has_post = plan.has_post
    slot.needs_init = plan.has_init   # _initialize runs on the worker, first
    globals_ = {idx: wasmtime.Global._from_raw(
        wt_ffi.wasmtime_global_t.from_buffer_copy(_export(ctx, inst, name, item).global_))
        for idx, name in plan.globals}
    return wasmtime.Instance._from_raw(inst), wasmtime.Memory._from_raw(mem), globals_


_FUNC_BYTES = ctypes.sizeof(wt_ffi.wasmtime_func_t)
_MEMORY_BYTES = ctypes.sizeof(wt_ffi.wasmtime_memory_t)


def memory_base(memory: wasmtime.Memory, store: wasmtime.Store) -> int:
    """The address of linear memory's byte 0 (with the pooling allocator: its slot's base)."""
    return ctypes.cast(memory.data_ptr(store), ctypes.c_void_p).value or 0


def copy_state(native: "Native", controller: "Controller",
               src: wasmtime.Store, src_memory: wasmtime.Memory, src_globals: dict[int, wasmtime.Global],
               dst: wasmtime.Store, dst_memory: wasmtime.Memory, dst_globals: dict[int, wasmtime.Global]) -> int:
    """Fork's copy of an instance of `controller` into `dst`, a fresh instance of the same
    controller that has not run (so its memory is zero outside the module's data image): linear
    memory and every mutable global (the loader exported them). Only the 4 KiB pages where the
    two can differ are written (pages.py): a page the parent left zero is skipped, so a fork
    costs what the parent dirtied, not its memory's size. Returns the pages written. Raises
    wasmtime.WasmtimeError if the copy cannot be made (e.g. memory cannot grow)."""
    plan = _plans[controller]   # made by the instantiation of src
    if plan.image is None:      # the data image: the same in every fresh instance of the controller
        plan.image = pages.nonzero_extent(native, memory_base(dst_memory, dst), dst_memory.data_len(dst))
    grow = src_memory.size(src) - dst_memory.size(dst)
    if grow > 0:
        dst_memory.grow(dst, grow)
    written = pages.copy_changed(native, memory_base(dst_memory, dst), memory_base(src_memory, src),
                                 src_memory.data_len(src), plan.image)
    # Raw value copies: the globals are numeric (the rewriter refuses others), and wasmtime-py's
    # Global.value/set_value cost ~10 µs each through Val objects.
    raw = wt_ffi.wasmtime_val_t()
    for idx, g in src_globals.items():
        wt_ffi.wasmtime_global_get(src._context(), ctypes.byref(g._global), ctypes.byref(raw))
        err = wt_ffi.wasmtime_global_set(dst._context(), ctypes.byref(dst_globals[idx]._global), ctypes.byref(raw))
        if err:
            raise wasmtime.WasmtimeError._from_ptr(err)
    return written
