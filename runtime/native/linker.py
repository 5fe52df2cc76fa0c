"""Defining a controller's imports in a Linker: host.c's native callbacks where they exist, the
Python trampoline (with a handler id as env) for the rest. Never wasmtime-py's callbacks, whose
exceptions pass through a process-global slot."""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Protocol

import wasmtime

from .. import abi

if TYPE_CHECKING:
    from . import Native


def _define(native: "Native", linker: wasmtime.Linker, module: str, name: str, ty: wasmtime.FuncType,
            cb: int, env: int) -> None:
    wt, lib = native.wt, native.wtlib
    m, n = module.encode(), name.encode()
    err = lib.wasmtime_linker_define_func_unchecked(
        wt.cast("void *", _addr(linker)), m, len(m), n, len(n), wt.cast("void *", _addr(ty)),
        wt.cast("void *", cb), wt.cast("void *", env), wt.NULL)
    if err != wt.NULL:
        from .traps import take_error_text
        raise RuntimeError(f"defining {module}.{name}: " + take_error_text(wt, lib, 0, int(wt.cast("uintptr_t", err))))


def _addr(managed: Any) -> int:   # a wasmtime-py object with a ctypes handle: ptr()
    return ctypes.cast(managed.ptr(), ctypes.c_void_p).value or 0


class HostHandlers(Protocol):
    """What the linker needs of the Python host: registered handler ids (see Native.add_handler)."""

    def handler_id(self, name: str) -> int: ...
    def wasi_handler_id(self, name: str, ty: wasmtime.FuncType) -> int: ...


def define_imports(native: "Native", linker: wasmtime.Linker, host: HostHandlers,
                   wasi_imports: list[tuple[str, wasmtime.FuncType]]) -> None:
    """Every WIT host import, and the WASI functions the module imports."""
    i32 = wasmtime.ValType.i32()
    for index, (name, (params, results)) in enumerate(abi.HOST_IMPORTS.items()):
        ty = wasmtime.FuncType([i32] * len(params), [i32] * len(results))
        cb, takes_handler = native.host_callback(index, name in abi.NATIVE_IMPORTS)
        _define(native, linker, abi.HOST_MODULE, name, ty, cb, host.handler_id(name) if takes_handler else 0)
    for name, ty in wasi_imports:
        cb = native.wasi_callback(name)   # wasi.c where it has the function (compiled path)
        if cb:
            _define(native, linker, abi.WASI_MODULE, name, ty, cb, 0)
        else:
            cb, _ = native.host_callback(-1, False)
            _define(native, linker, abi.WASI_MODULE, name, ty, cb, host.wasi_handler_id(name, ty))
