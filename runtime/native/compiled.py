"""The compiled hot path: step.c's worker pool and host.c's native imports and variables."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import fn_addr
from .build import load_extension
from .types import CData, CLib

if TYPE_CHECKING:
    from _cffi_backend import FFI as CompiledFFI   # the ffi of an API-mode extension

    from . import EditArrays, Native


def _ptr(ffi: "CompiledFFI", ctype: str, arr: np.ndarray) -> CData:
    """A C pointer into a contiguous numpy array (which the caller keeps alive for the call)."""
    return ffi.from_buffer(ctype, arr)  # type: ignore[call-overload]   # numpy arrays have the buffer protocol


class Compiled:
    mode = "compiled"

    def __init__(self, native: "Native") -> None:
        mod = load_extension()
        self.ffi, self.lib = ffi, lib = mod.ffi, mod.lib
        size = lib.aicirt_bind(*(ffi.cast("void *", fn_addr(n)) for n in (
            "wasmtime_func_call_unchecked", "wasmtime_memory_data", "wasmtime_memory_data_size",
            "wasmtime_context_set_epoch_deadline", "wasmtime_caller_context", "wasmtime_context_get_data",
            "wasmtime_trap_new", "wasmtime_error_delete")))
        if size != ffi.sizeof("aicirt_slot"):
            raise RuntimeError("aicirt_slot layout differs between step.c and ffi_decl.py")

        @ffi.def_extern(name="aicirt_py_import")
        def py_import(index: int, slot: CData, ctx: CData, args: CData) -> int:   # the GIL is taken by cffi
            return native.dispatch(index, slot, ctx, args)

        self._py_import = py_import
        self.log_append = lambda slot, data: lib.aicirt_log_append(slot, data, len(data))

    def release(self, slot: CData) -> None:
        """Free the slot's native buffers (its log, the tokens it saw)."""
        self.lib.aicirt_slot_release(slot)
        self.lib.aicirt_seen_free(slot)

    def seen_tokens(self, slot: CData) -> list[int]:
        """The tokens the slot's controller has seen."""
        return self.ffi.unpack(slot.seen, slot.n_seen) if slot.n_seen else []

    def copy_seen(self, src: CData, dst: CData) -> None:
        if self.lib.aicirt_seen_copy(src, dst):
            raise MemoryError("a fork's token list")

    def collect_rows(self, ptrs: np.ndarray, row_status: np.ndarray, kind: np.ndarray, temperature: np.ndarray,
                     elapsed_us: np.ndarray) -> None:
        """step.c's aicirt_rows_collect over the batch's arrays (see RowKind)."""
        ffi = self.ffi
        self.lib.aicirt_rows_collect(_ptr(ffi, "aicirt_slot *[]", ptrs), len(ptrs),
                                     _ptr(ffi, "int8_t[]", row_status), _ptr(ffi, "uint8_t[]", kind),
                                     _ptr(ffi, "float[]", temperature), _ptr(ffi, "double[]", elapsed_us))

    def make_pool(self, workers: int, max_workers: int, stall_s: float) -> "CPool":
        return CPool(self.ffi, self.lib, workers, max_workers, stall_s)

    def memory(self, slot: CData) -> tuple[int, int]:
        """(address, size) of the slot's linear memory."""
        size = self.ffi.new("size_t *")
        ptr = self.lib.aicirt_memory(slot, size)
        return int(self.ffi.cast("uintptr_t", ptr)), size[0]

    def ctx_memory(self, slot: CData, ctx: CData) -> tuple[int, int]:
        size = self.ffi.new("size_t *")
        ptr = self.lib.aicirt_ctx_memory(slot, ctx, size)
        return int(self.ffi.cast("uintptr_t", ptr)), size[0]

    def ctx_alloc(self, slot: CData, ctx: CData, align: int, n: int, name: str) -> int:
        return self.lib.aicirt_ctx_alloc(slot, ctx, align, n, name.encode())

    def check_mask(self, mem: int, size: int, ptr: int, words: int, vocab_size: int, row: int) -> tuple[int, int, int]:
        """The mask rule (step.c's aicirt_check_mask): copies into `row`; (status, detail0, detail1)."""
        d = self.ffi.new("uint32_t[2]")
        st = self.lib.aicirt_check_mask(self.ffi.cast("uint8_t *", mem), size, ptr, words, vocab_size,
                                        self.ffi.cast("uint32_t *", row), d)
        return st, d[0], d[1]

    def host_callback(self, index: int, native_ok: bool) -> tuple[int, bool]:
        """(callback address, whether it takes a Python handler id as env) for host import `index`."""
        cb = self.lib.aicirt_host_callback(index if native_ok else -1)
        return int(self.ffi.cast("uintptr_t", cb)), not native_ok

    def new_vars(self, limit: int) -> "CVars":
        return CVars(self.ffi, self.lib, limit)


class CPool:
    """step.c's pthread worker pool: submit slots, wait for their `done` flags (GIL released)."""

    def __init__(self, ffi: "CompiledFFI", lib: CLib, workers: int, max_workers: int, stall_s: float) -> None:
        self.ffi, self.lib = ffi, lib
        self.ptr = lib.aicirt_pool_new(workers, max_workers, stall_s * 1e6)
        if self.ptr == ffi.NULL:
            raise RuntimeError("could not start controller worker threads")

    def start_rows(self, ptrs: np.ndarray, sampled: np.ndarray, edits: "EditArrays | None", mask_base: int,
                   words: int, stamp: int, row_status: np.ndarray) -> tuple[int, int]:
        """step.c's aicirt_rows_start: (0, 0), or (-(row + 1), misuse) with nothing started."""
        ffi = self.ffi
        misuse = ffi.new("int *")
        if edits is None:
            of = off = tok = unchanged = ffi.NULL
        else:
            of, off = _ptr(ffi, "int32_t[]", edits.of_row), _ptr(ffi, "int64_t[]", edits.offsets)
            tok = _ptr(ffi, "uint32_t[]", edits.tokens) if len(edits.tokens) else ffi.NULL
            unchanged = _ptr(ffi, "uint32_t[]", edits.unchanged)
        rc = self.lib.aicirt_rows_start(self.ptr, _ptr(ffi, "aicirt_slot *[]", ptrs), len(ptrs),
                                        _ptr(ffi, "int32_t[]", sampled), of, off, tok, unchanged,
                                        ffi.cast("uint32_t *", mask_base), words, stamp,
                                        _ptr(ffi, "int8_t[]", row_status), misuse)
        return rc, misuse[0]

    def wait(self, ptrs: np.ndarray, timeout_s: float) -> int:
        """Block until every slot of `ptrs` (uint64 addresses) is done or `timeout_s` passes;
        returns how many are not done."""
        return self.lib.aicirt_pool_wait(self.ptr, _ptr(self.ffi, "aicirt_slot *[]", ptrs), len(ptrs),
                                         timeout_s * 1e6)

    @property
    def pending(self) -> int:
        """Calls running or queued (0 once closed)."""
        return self.lib.aicirt_pool_pending(self.ptr) if self.ptr is not None else 0

    @property
    def threads(self) -> int:
        """Workers alive now: the base ones plus any started while others were stalled."""
        return self.lib.aicirt_pool_threads(self.ptr)

    def close(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            self.lib.aicirt_pool_free(ptr)


class CVars:
    """A request's variables in host.c (shared by its forks' worker threads; mutex inside)."""

    def __init__(self, ffi: "CompiledFFI", lib: CLib, limit: int) -> None:
        self.ffi, self.lib, self.limit = ffi, lib, limit
        self.ptr = lib.aicirt_vars_new(limit)
        if self.ptr == ffi.NULL:
            raise MemoryError("request variables")

    def get(self, name: str) -> bytes | None:
        ffi = self.ffi
        raw = name.encode("utf-8")
        copy, n = ffi.new("uint8_t **"), ffi.new("uint32_t *")
        rc = self.lib.aicirt_vars_get(self.ptr, raw, len(raw), copy, n)
        if rc < 0:
            raise MemoryError("request variables")
        if rc == 0:
            return None
        try:
            return bytes(ffi.buffer(copy[0], n[0]))
        finally:
            self.lib.aicirt_free(copy[0])

    def set(self, seq_id: int, name: str, value: bytes, append: bool) -> None:
        raw = name.encode("utf-8")
        would = self.ffi.new("uint64_t *")
        rc = self.lib.aicirt_vars_set(self.ptr, seq_id, raw, len(raw), value, len(value), int(append), would)
        if rc > 0:
            raise ValueError(f"variables would take {would[0]} bytes, over the limit of {self.limit} "
                             f"(Limits.variable_bytes)")
        if rc < 0:
            raise MemoryError("request variables")

    def _read(self, n: int, out: CData) -> list[tuple[int, str, str, bytes]]:
        ffi = self.ffi
        try:
            return [(c.seq_id, "append" if c.append else "set",
                     bytes(ffi.buffer(c.name, c.name_len)).decode("utf-8"), bytes(ffi.buffer(c.value, c.len)))
                    for c in (out[0][i] for i in range(n))]
        finally:
            if n:
                self.lib.aicirt_vars_free_changes(out[0], n)

    def take_changes(self) -> list[tuple[int, str, str, bytes]]:
        out = self.ffi.new("aicirt_var_change **")
        return self._read(self.lib.aicirt_vars_take(self.ptr, out), out)

    def snapshot(self) -> dict[str, bytes]:
        out = self.ffi.new("aicirt_var_change **")
        n = self.lib.aicirt_vars_snapshot(self.ptr, out)
        if n < 0:
            raise MemoryError("request variables")
        if n == 0:
            self.lib.aicirt_free(out[0])
            return {}
        return {name: value for _, _, name, value in self._read(n, out)}

    def close(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            self.lib.aicirt_vars_free(ptr)
