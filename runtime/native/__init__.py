"""The FFI layer: the only place that talks to libwasmtime below wasmtime-py's public API.

Two interchangeable backends expose the same calls (a worker pool, post-return, a view of linear
memory) over the same ``aicirt_slot`` struct:

* ``compiled``: ``step.c`` built once with cffi's API mode (cached under the user cache dir);
  pthread workers run sequence-steps with the GIL released (~1 µs a sequence-step).
* ``python``: the same logic in Python over cffi's ABI mode and Python threads, for machines
  without a C compiler (or with ``AICIRT_NATIVE=python``); about 40 times slower, same results.

Both call into the very libwasmtime that wasmtime-py loaded, through function pointers taken from
it, so handles made with wasmtime-py (stores, funcs, memories) are valid here.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import sys
import threading
import warnings
from pathlib import Path

import cffi
import wasmtime
from wasmtime import _ffi as wt_ffi

from ..paths import user_cache_dir
from .ffi_decl import CDEF_SLOT, CDEF_STEP, CDEF_WASMTIME

_HERE = Path(__file__).resolve().parent
STATUS_OK, STATUS_LIFT = 0, 1
STATUS_TRAP, STATUS_BAD_ALLOC, STATUS_BAD_RESULT, STATUS_BAD_MASK, STATUS_EMPTY_MASK = -1, -2, -3, -4, -5


def _fn_addr(name: str) -> int:
    return ctypes.cast(getattr(wt_ffi.dll, name), ctypes.c_void_p).value


class Native:
    """The loaded hot path: ``ffi``, ``make_pool(workers)``, ``post(slot)``, ``memory(slot)``."""

    def __init__(self) -> None:
        self.wt = cffi.FFI()
        self.wt.cdef(CDEF_SLOT + CDEF_WASMTIME)
        self.wtlib = self.wt.dlopen(str(wt_ffi.filename))
        want = os.environ.get("AICIRT_NATIVE", "compiled")
        self.mode = "python"
        if want != "python":
            try:
                self._load_compiled()
                self.mode = "compiled"
            except Exception as e:  # no compiler, no headers: slower, same semantics
                warnings.warn(f"aicirt: C hot path unavailable ({e}); using the Python fallback", RuntimeWarning)
        if self.mode == "python":
            from . import fallback
            self.ffi = self.wt
            impl = fallback.Fallback(self.wt, self.wtlib)
            self.post, self.memory = impl.post, impl.memory
            self.make_pool = lambda workers: fallback.ThreadPool(impl, workers)

    def _load_compiled(self) -> None:
        source = (_HERE / "step.c").read_text()
        key = hashlib.sha256((source + CDEF_SLOT + CDEF_STEP + sys.version + cffi.__version__).encode()).hexdigest()[:16]
        name = f"_aicirt_step_{key}"
        out = user_cache_dir("native")
        built = [p for p in out.glob(name + "*.so")] if out.exists() else []
        if not built:
            out.mkdir(parents=True, exist_ok=True)
            builder = cffi.FFI()
            builder.cdef(CDEF_SLOT + CDEF_STEP)
            builder.set_source(name, source, extra_compile_args=["-O3"])
            tmp = out / f"build-{os.getpid()}-{threading.get_ident()}"
            so = builder.compile(tmpdir=str(tmp), verbose=False)
            final = out / Path(so).name
            os.replace(so, final)
            built = [final]
        spec = importlib.util.spec_from_file_location(name, built[0])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        self.ffi, lib = mod.ffi, mod.lib
        size = lib.aicirt_bind(
            self.ffi.cast("void *", _fn_addr("wasmtime_func_call_unchecked")),
            self.ffi.cast("void *", _fn_addr("wasmtime_memory_data")),
            self.ffi.cast("void *", _fn_addr("wasmtime_memory_data_size")),
            self.ffi.cast("void *", _fn_addr("wasmtime_context_set_epoch_deadline")),
        )
        if size != self.ffi.sizeof("aicirt_slot"):
            raise RuntimeError("aicirt_slot layout differs between step.c and ffi_decl.py")
        self.post = lib.aicirt_post
        self.make_pool = lambda workers: CPool(self.ffi, lib, workers)

        def memory(slot):
            size = self.ffi.new("size_t *")
            ptr = lib.aicirt_memory(slot, size)
            return ptr, size[0]

        self.memory = memory

    # -- helpers shared by both modes --------------------------------------------------------
    def error_text(self, slot) -> str:
        """Format and free the trap / error a failed call left in ``slot``."""
        ffi, lib = self.wt, self.wtlib
        parts = []
        trap_addr = int(self.ffi.cast("uintptr_t", slot.trap))
        err_addr = int(self.ffi.cast("uintptr_t", slot.error))
        slot.trap = slot.error = self.ffi.NULL
        if trap_addr:
            trap = ffi.cast("wasm_trap_t *", trap_addr)
            code = ffi.new("uint8_t *")
            is_code = lib.wasmtime_trap_code(trap, code)
            msg = ffi.new("wasm_byte_vec_t *")
            lib.wasm_trap_message(trap, msg)
            text = ffi.string(msg.data, msg.size).decode("utf-8", "replace").rstrip("\0")
            lib.wasm_byte_vec_delete(msg)
            lib.wasm_trap_delete(trap)
            if is_code and code[0] == 10:  # WASMTIME_TRAP_CODE_INTERRUPT
                text = "interrupted: exceeded the time limit for one call"
            parts.append(f"trap: {summarize_trap(text)}")
        if err_addr:
            err = ffi.cast("wasmtime_error_t *", err_addr)
            msg = ffi.new("wasm_byte_vec_t *")
            lib.wasmtime_error_message(err, msg)
            parts.append(ffi.string(msg.data, msg.size).decode("utf-8", "replace"))
            lib.wasm_byte_vec_delete(msg)
            lib.wasmtime_error_delete(err)
        return "; ".join(parts) or "unknown failure"


class CPool:
    """step.c's pthread worker pool: submit slots, wait for their `done` flags (GIL released)."""

    def __init__(self, ffi, lib, workers: int) -> None:
        self.ffi, self.lib = ffi, lib
        self.ptr = lib.aicirt_pool_new(workers)
        if self.ptr == ffi.NULL:
            raise RuntimeError("could not start controller worker threads")

    def submit(self, slots: list) -> None:
        if self.lib.aicirt_pool_submit(self.ptr, self.ffi.new("aicirt_slot *[]", slots), len(slots)):
            raise MemoryError("controller queue")

    def wait(self, slots: list, timeout_s: float) -> int:
        """Block until all `slots` are done or `timeout_s` passes; returns how many are not done."""
        return self.lib.aicirt_pool_wait(self.ptr, self.ffi.new("aicirt_slot *[]", slots), len(slots), timeout_s * 1e6)

    def close(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            self.lib.aicirt_pool_free(ptr)


def summarize_trap(text: str, frames: int = 4) -> str:
    """wasmtime's trap text in one line: the cause, then where (innermost function first)."""
    cause = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), text)
    cause = cause.removeprefix("wasm trap: ")
    names: list[str] = []
    for ln in text.splitlines():
        if "!" in ln and ln.lstrip()[:1].isdigit():
            name = ln.rsplit("!", 1)[1].strip()
            if not names or names[-1] != name:
                names.append(name)
    where = " <- ".join(names[:frames]) + (" <- ..." if len(names) > frames else "")
    return f"{cause} (in {where})" if names else cause


_native: Native | None = None
_lock = threading.Lock()


def get_native() -> Native:
    """The process-wide hot path (built or loaded on first use; thread-safe)."""
    global _native
    with _lock:
        if _native is None:
            _native = Native()
        return _native


def slot_bind(native: Native, slot, store: wasmtime.Store, funcs: dict, memory: wasmtime.Memory) -> None:
    """Point ``slot`` at one instance's store, functions and memory (raw handle copies)."""
    ffi = native.ffi
    slot.ctx = ffi.cast("void *", ctypes.cast(store._context(), ctypes.c_void_p).value)
    for field, func in funcs.items():
        if func is not None:
            ffi.memmove(ffi.addressof(slot, field), bytes(func._func), ffi.sizeof("wt_func_t"))
    slot.has_post = funcs.get("f_post") is not None
    ffi.memmove(ffi.addressof(slot, "mem"), bytes(memory._memory), ffi.sizeof("wt_memory_t"))
