"""Per-sequence wasmtime handles for the hot path: the Store's data pointer, instantiation with
raw handle copies into the slot, and the state copy behind fork."""
from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING, Any

import cffi
import wasmtime
from wasmtime import _ffi as wt_ffi

from .. import abi
from . import pages
from .types import CData, CLib

if TYPE_CHECKING:
    from ..controller import Controller
    from . import Native


def context_addr(store: wasmtime.Store) -> int:
    return ctypes.cast(store._context(), ctypes.c_void_p).value or 0


def new_store(native: "Native", engine: wasmtime.Engine, slot: CData, memory_bytes: int) -> wasmtime.Store:
    """A Store for `slot`'s sequence: linear memory limited to `memory_bytes`, bound to `slot`
    (see `bind`), its epoch deadline at the first-call limit (`slot.first_call_ticks`)."""
    store = wasmtime.Store(engine)
    _wtlib.wasmtime_store_limiter(_wt.cast("void *", ctypes.cast(store.ptr(), ctypes.c_void_p).value or 0),
                                  memory_bytes, -1, -1, -1, -1)
    bind(native, slot, store)
    return store


def bind(native: "Native", slot: CData, store: wasmtime.Store) -> None:
    """Make `slot` the Store's data (host.c's imports find their sequence through it), and the
    data of the Store's epoch-deadline callback, which holds its calls to their limits in CPU
    time (step.c). The deadline is set to the first-call limit (`slot.first_call_ticks`) and the
    clock starts now, on this thread (a worker restarts it for each call)."""
    ctx = context_addr(store)
    slot.ctx = native.ffi.cast("void *", ctx)
    wt, lib = native.wt, native.wtlib
    data, wt_ctx = wt.cast("void *", native.addr(slot)), wt.cast("void *", ctx)
    lib.wasmtime_context_set_data(wt_ctx, data)
    lib.wasmtime_context_set_epoch_deadline(wt_ctx, slot.first_call_ticks)
    store_ptr = ctypes.cast(store.ptr(), ctypes.c_void_p).value or 0
    lib.wasmtime_store_epoch_deadline_callback(
        wt.cast("void *", store_ptr), wt.cast("wt_epoch_cb", native.epoch_callback), data, wt.NULL)
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
        self.funcs = [(field, *_c_name(name)) for field, name in funcs]
        self.memory = _c_name("memory")
        self.globals = [(idx, *_c_name(name)) for idx, name in controller.globals.items()]
        self.has_post, self.has_init = controller.has_post, controller.has_initialize
        self.image: tuple[int, int] | None = None   # a fresh instance's nonzero pages (bytes), at the first fork


def _c_name(name: str) -> tuple[bytes, int]:
    data = name.encode()
    return data, len(data)


# wasmtime's C API for Store limits and instantiation, through cffi (a call costs about a fifth of a ctypes one):
# the struct layouts are wasmtime 50's (wasmtime/instance.h, extern.h), checked against
# wasmtime-py's own bindings below.
_wt = cffi.FFI()
_wt.cdef("""
typedef struct { uint64_t store_id; size_t index; } wt_instance_t;
typedef struct { uint8_t kind; uint64_t of[3]; } wt_extern_t;
void *wasmtime_instance_pre_instantiate(void *pre, void *ctx, wt_instance_t *out, void **trap);
bool wasmtime_instance_export_get(void *ctx, const wt_instance_t *inst, const char *name, size_t len, wt_extern_t *item);
void wasmtime_store_limiter(void *store, int64_t memory_size, int64_t table_elements, int64_t instances,
                            int64_t tables, int64_t memories);
""")
_wtlib: CLib = _wt.dlopen(str(wt_ffi.filename))
assert (_wt.sizeof("wt_instance_t"), _wt.sizeof("wt_extern_t"), _wt.offsetof("wt_extern_t", "of")) == (
    ctypes.sizeof(wt_ffi.wasmtime_instance_t), ctypes.sizeof(wt_ffi.wasmtime_extern_t), wt_ffi.wasmtime_extern_t.of.offset)
_plans: "weakref.WeakKeyDictionary[Controller, _Plan]" = weakref.WeakKeyDictionary()
_pre_addrs: "weakref.WeakKeyDictionary[wasmtime.InstancePre, Any]" = weakref.WeakKeyDictionary()
_FUNC_BYTES = ctypes.sizeof(wt_ffi.wasmtime_func_t)
_MEMORY_BYTES = ctypes.sizeof(wt_ffi.wasmtime_memory_t)
_GLOBAL_BYTES = ctypes.sizeof(wt_ffi.wasmtime_global_t)
WASM_PAGE = 1 << 16


def instantiate(native: "Native", slot: CData, pre: wasmtime.InstancePre, store: wasmtime.Store,
                controller: "Controller") -> tuple[wasmtime.Instance, wasmtime.Memory, dict[int, wasmtime.Global]]:
    """A fresh instance of `controller` in `store` (whose data `slot` already is, see `bind`), with
    `slot` pointed at its functions and memory (raw handle copies); returns the instance, its
    memory and its mutable globals (by index, for fork). The few exports are looked up by name
    through the C API instead of wasmtime-py's export map, which wraps every export (2/3 of an
    instantiation's time). Every handle is copied out of the lookup's extern, which this frame
    holds, before the next lookup reuses it: never read a handle through the address of a
    temporary (ctypes or cffi) object, whose memory may be freed and reused by another thread
    while a call has the GIL released (the cause of the 'object used with the wrong store'
    aborts the first version of this had). Raises wasmtime.WasmtimeError or wasmtime.Trap if
    instantiation fails."""
    plan = _plans.get(controller)
    if plan is None:
        assert native.ffi.sizeof("wt_func_t") == _FUNC_BYTES and native.ffi.sizeof("wt_memory_t") == _MEMORY_BYTES
        plan = _plans[controller] = _Plan(controller)
    pre_ptr = _pre_addrs.get(pre)
    if pre_ptr is None:
        pre_ptr = _pre_addrs[pre] = _wt.cast("void *", ctypes.cast(pre.ptr(), ctypes.c_void_p).value or 0)
    wt, lib = _wt, _wtlib
    ctx = wt.cast("void *", native.addr(slot.ctx))
    inst = wt.new("wt_instance_t *")
    trap = wt.new("void **")
    err = lib.wasmtime_instance_pre_instantiate(pre_ptr, ctx, inst, trap)
    if err != wt.NULL:
        raise wasmtime.WasmtimeError._from_ptr(ctypes.cast(int(wt.cast("uintptr_t", err)), ctypes.POINTER(wt_ffi.wasmtime_error_t)))
    if trap[0] != wt.NULL:
        raise wasmtime.Trap._from_ptr(ctypes.cast(int(wt.cast("uintptr_t", trap[0])), ctypes.POINTER(wt_ffi.wasm_trap_t)))
    item = wt.new("wt_extern_t *")
    whole = wt.buffer(item)

    def lookup(name: bytes, n: int) -> bytes:
        if not lib.wasmtime_instance_export_get(ctx, inst, name, n, item):
            raise wasmtime.WasmtimeError(f"export {name.decode()!r} is missing")   # the loader checked
        return whole[8:]   # a copy of item.of (slicing a cffi buffer copies), taken while `item` is alive

    ffi = native.ffi
    for field, name, n in plan.funcs:
        ffi.memmove(ffi.addressof(slot, field), lookup(name, n), _FUNC_BYTES)
    mem_bytes = lookup(*plan.memory)
    ffi.memmove(ffi.addressof(slot, "mem"), mem_bytes, _MEMORY_BYTES)
    slot.has_post = plan.has_post
    slot.needs_init = plan.has_init   # _initialize runs on the worker, first
    globals_ = {idx: wasmtime.Global._from_raw(wt_ffi.wasmtime_global_t.from_buffer_copy(lookup(name, n)[:_GLOBAL_BYTES]))
                for idx, name, n in plan.globals}
    memory = wasmtime.Memory._from_raw(wt_ffi.wasmtime_memory_t.from_buffer_copy(mem_bytes[:_MEMORY_BYTES]))
    return (wasmtime.Instance._from_raw(wt_ffi.wasmtime_instance_t.from_buffer_copy(wt.buffer(inst))),
            memory, globals_)


def memory_base(memory: wasmtime.Memory, store: wasmtime.Store) -> int:
    """The address of linear memory's byte 0 (with the pooling allocator: its slot's base)."""
    return ctypes.cast(memory.data_ptr(store), ctypes.c_void_p).value or 0


def copy_state(native: "Native", controller: "Controller",
               src_slot: CData, src: wasmtime.Store, src_globals: dict[int, wasmtime.Global],
               dst_slot: CData, dst: wasmtime.Store, dst_memory: wasmtime.Memory,
               dst_globals: dict[int, wasmtime.Global]) -> int:
    """Fork's copy of an instance of `controller` (its slot, Store and globals) into `dst`, a
    fresh instance of the same controller that has not run (so its memory is zero outside the
    module's data image): linear memory and every mutable global (the loader exported them).
    Only the 4 KiB pages where the two can differ are written (pages.py): a page the parent left
    zero is skipped, so a fork costs what the parent dirtied, not its memory's size. The
    memories' addresses and sizes are read through the hot path (`native.memory`, one call each).
    Returns the pages written. Raises wasmtime.WasmtimeError if the copy cannot be made (e.g.
    memory cannot grow)."""
    plan = _plans[controller]   # made by the instantiation of src
    dst_base, dst_size = native.memory(dst_slot)
    if plan.image is None:      # the data image: the same in every fresh instance of the controller
        plan.image = pages.nonzero_extent(native, dst_base, dst_size)
    src_base, src_size = native.memory(src_slot)
    if src_size > dst_size:
        dst_memory.grow(dst, (src_size - dst_size) // WASM_PAGE)
        dst_base, dst_size = native.memory(dst_slot)
    written = pages.copy_changed(native, dst_base, src_base, src_size, plan.image)
    # Raw value copies: the globals are numeric (the rewriter refuses others), and wasmtime-py's
    # Global.value/set_value cost ~10 µs each through Val objects.
    raw = wt_ffi.wasmtime_val_t()
    for idx, g in src_globals.items():
        wt_ffi.wasmtime_global_get(src._context(), ctypes.byref(g._global), ctypes.byref(raw))
        err = wt_ffi.wasmtime_global_set(dst._context(), ctypes.byref(dst_globals[idx]._global), ctypes.byref(raw))
        if err:
            raise wasmtime.WasmtimeError._from_ptr(err)
    return written
