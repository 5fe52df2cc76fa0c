"""Per-sequence wasmtime instances for the hot path: one controller's spawn plan, a sequence's
instance in one hot-path call (`spawn`), fork's copy of one instance into another (`fork_copy`),
and wasmtime-py views of a slot's Store, memory and globals for the rare Python-side use.

The slot owns its Store (`slot.store`, freed by `Native.store_delete`). The hot path
does a spawn and a fork copy each in one C call (spawn.c). No wasmtime-py object is made per sequence unless a caller asks
for one (`store_view`, `memory_view`, `global_views`): a view borrows the slot's handles and
must not be used after the sequence is closed (the view of the Store is closed with it)."""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import wasmtime
from wasmtime import _ffi as wt_ffi

from .. import abi
from . import pages
from .types import CData

if TYPE_CHECKING:
    from ..loader.controller import Controller
    from . import Native


class SpawnPlan:
    """What every instance of one controller in one Runtime binds, worked out once: the engine
    and InstancePre (addresses; `pre` is kept alive here), the Store's memory limit, the exports'
    names, the mutable globals' names (a fork copies them), and the fresh instance's nonzero
    extent (`image`, bytes; found at the first fork). `impl` is the hot path's own form of it
    (spawn.c's struct, made on first use)."""

    def __init__(self, engine: wasmtime.Engine, pre: wasmtime.InstancePre, controller: "Controller",
                 memory_bytes: int) -> None:
        self.engine = engine
        self.pre = pre
        self.engine_addr = _addr(engine.ptr())
        self.pre_addr = _addr(pre.ptr())
        self.memory_bytes = memory_bytes
        self.has_post, self.has_init = bool(controller.has_post), bool(controller.has_initialize)
        self.has_prepare = bool(getattr(controller, "has_prepare", False))
        # cabi_realloc, mid-process, post-return, _initialize, memory, aicirt_prepare, aicirt_prepare_template
        # (spawn.c's order); None: not exported
        self.names: list[bytes | None] = [abi.EXPORT_REALLOC.encode(), abi.EXPORT_MID_PROCESS.encode(),
                                          abi.EXPORT_POST.encode() if self.has_post else None,
                                          abi.EXPORT_INITIALIZE.encode() if self.has_init else None, b"memory",
                                          abi.EXPORT_PREPARE.encode() if self.has_prepare else None,
                                          abi.EXPORT_PREPARE_TEMPLATE.encode()
                                          if getattr(controller, "has_prepare_template", False) else None]
        self.globals: list[tuple[int, bytes]] = [(idx, name.encode()) for idx, name in controller.globals.items()]
        self.image: tuple[int, int] | None = None
        self.impl: Any = None


def _addr(ptr: Any) -> int:
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0


def spawn(native: "Native", plan: SpawnPlan, slot: CData) -> str | None:
    """A fresh instance in `slot` (its limits already written; see spawn.c's aicirt_spawn): None,
    or why it could not be made (no free pooled slot, the memory limit too small, ...). Either
    way the slot may own a Store the caller frees with `Native.store_delete`."""
    if native.spawn(plan, slot):
        return native.error_text(slot)
    return None


def fork_copy(native: "Native", plan: SpawnPlan, src: CData, dst: CData) -> int:
    """Fork's copy of the idle instance in `src` into `dst`, a fresh instance of the same plan
    that has not run (spawn.c's aicirt_fork_copy: memory where it can differ from a fresh
    instance, mutable globals, tokens seen, the per-call record). Returns the 4 KiB pages
    written. Raises wasmtime.WasmtimeError naming the cause if the copy cannot be made (e.g.
    memory cannot grow)."""
    if plan.image is None:      # the data image: the same in every fresh instance of the controller
        base, size = native.memory(dst)
        plan.image = pages.nonzero_extent(native, base, size)
    written = native.fork_copy(plan, src, dst)
    if written < 0:
        raise wasmtime.WasmtimeError(native.error_text(dst))
    return written


# -- wasmtime-py views of a slot's handles (tests, benchmarks, rare host-side use) -------------------
class _BorrowedStore(wasmtime.Store):
    """A wasmtime.Store over a Store the slot owns: closing (or collecting) the view frees nothing."""

    def _delete(self, ptr: Any) -> None:
        setattr(self, "_Store__context", None)   # as wasmtime-py's Store._delete: a use after close raises


def store_view(engine: wasmtime.Engine, slot: CData, native: "Native") -> wasmtime.Store:
    """A wasmtime-py Store object for the slot's Store (borrowed: see the module docstring)."""
    view = _BorrowedStore.__new__(_BorrowedStore)
    ptr = ctypes.cast(native.addr(slot.store), ctypes.POINTER(wt_ffi.wasmtime_store_t))
    view._set_ptr(ptr)
    setattr(view, "_Store__context", wt_ffi.wasmtime_store_context(ptr))   # Store.__init__'s own field
    view.engine = engine
    return view


def memory_view(native: "Native", slot: CData) -> wasmtime.Memory:
    """A wasmtime-py Memory for the slot's linear memory (a copy of its handle)."""
    raw = bytes(native.ffi.buffer(native.ffi.addressof(slot, "mem")))
    return wasmtime.Memory._from_raw(wt_ffi.wasmtime_memory_t.from_buffer_copy(raw[:ctypes.sizeof(wt_ffi.wasmtime_memory_t)]))


def instance_view(native: "Native", slot: CData) -> wasmtime.Instance:
    """A wasmtime-py Instance for the slot's instance (a copy of its handle)."""
    raw = bytes(native.ffi.buffer(native.ffi.addressof(slot, "inst")))
    return wasmtime.Instance._from_raw(wt_ffi.wasmtime_instance_t.from_buffer_copy(raw))


def global_views(store: wasmtime.Store, instance: wasmtime.Instance, plan: SpawnPlan) -> dict[int, wasmtime.Global]:
    """The instance's mutable globals (by index), as the loader exported them."""
    ex = instance.exports(store)
    out = {}
    for idx, name in plan.globals:
        g = ex[name.decode()]
        assert isinstance(g, wasmtime.Global)
        out[idx] = g
    return out

