"""The host side of WIT interface `host` and the `wasi_snapshot_preview1` shim (SPEC §2).

Each import finds its sequence from the calling Store's data, reads arguments out of linear memory
with bounds checks, and returns lists through the guest's `cabi_realloc` and a return area.
A guest that passes a bad pointer gets a trap with a message saying which import and why; the
trap ends only its own sequence.

Host imports run rarely (setup, variables, logs), so they use wasmtime-py's ordinary callbacks;
the per-token path never goes through them.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import TYPE_CHECKING, Callable

import wasmtime
from wasmtime import _ffi as wt_ffi
from wasmtime import _func as wt_func

from . import abi

if TYPE_CHECKING:
    from .sequence import Sequence

_ENOSYS, _EBADF, _ESUCCESS = 52, 8, 0


class GuestFault(Exception):
    """The guest passed something invalid to a host import; becomes a trap for its sequence."""


def _raise_fault(seq: "Sequence", message: str):
    seq.fault = message
    raise GuestFault(message)


class Guest:
    """Memory access for one host call: bounds-checked reads, writes and allocations."""

    __slots__ = ("seq", "caller", "base", "size", "name")

    def __init__(self, seq: "Sequence", caller, name: str):
        self.seq, self.caller, self.name = seq, caller, name
        self.base = ctypes.cast(seq.memory.data_ptr(caller), ctypes.c_void_p).value or 0
        self.size = seq.memory.data_len(caller)

    def _check(self, ptr: int, n: int) -> None:
        if ptr < 0 or n < 0 or ptr + n > self.size:
            _raise_fault(self.seq, f"host import `{self.name}`: range [{ptr}, {ptr + n}) is outside linear memory ({self.size} bytes)")

    def read(self, ptr: int, n: int) -> bytes:
        ptr &= 0xFFFFFFFF
        n &= 0xFFFFFFFF
        cap = self.seq.request.runtime.limits.host_arg_bytes
        if n > cap:   # host work happens under the GIL, where the epoch limit cannot stop it
            _raise_fault(self.seq, f"host import `{self.name}`: an argument of {n} bytes is over the limit "
                                   f"of {cap} (Limits.host_arg_bytes)")
        self._check(ptr, n)
        return ctypes.string_at(self.base + ptr, n)

    def read_str(self, ptr: int, n: int) -> str:
        raw = self.read(ptr, n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            _raise_fault(self.seq, f"host import `{self.name}`: string is not valid UTF-8")

    def write(self, ptr: int, data: bytes) -> None:
        ptr &= 0xFFFFFFFF
        self._check(ptr, len(data))
        ctypes.memmove(self.base + ptr, data, len(data))

    def alloc(self, data: bytes, align: int) -> int:
        """Copy `data` into memory the guest allocates with cabi_realloc; returns its pointer."""
        if not data:
            return 0
        ptr = self.seq.realloc(self.caller, 0, 0, align, len(data)) & 0xFFFFFFFF
        # realloc may have grown memory, which can move it
        self.base = ctypes.cast(self.seq.memory.data_ptr(self.caller), ctypes.c_void_p).value or 0
        self.size = self.seq.memory.data_len(self.caller)
        self.write(ptr, data)
        return ptr

    def return_list(self, retptr: int, data: bytes, align: int, count: int) -> None:
        self.write(retptr, struct.pack("<II", self.alloc(data, align), count))


class HostImports:
    """Defines the imports of one controller module in a Linker; finds sequences via `lookup`."""

    def __init__(self, tokenizer, lookup: Callable[[int], "Sequence"]) -> None:
        self.tokenizer = tokenizer
        self.lookup = lookup
        self._trie: bytes | None = None
        self._trie_lock = threading.Lock()

    def prebuild_trie(self) -> None:
        """Build the trie on a background thread now (an engine loads its model meanwhile), so
        that the first controller asking for it does not wait."""
        threading.Thread(target=lambda: self.trie, daemon=True, name="aicirt-trie").start()

    @property
    def trie(self) -> bytes:
        with self._trie_lock:
            if self._trie is None:
                from .toktrie import serialize_trie  # built on first use: ~0.1-1 s for a 150k vocab
                self._trie = serialize_trie(self.tokenizer.token_bytes)
        return self._trie

    def _seq(self, caller) -> "Sequence":
        return self.lookup(wt_ffi.wasmtime_context_get_data(caller._context()))

    def define(self, linker: wasmtime.Linker, wasi_imports) -> None:
        for name, (params, results) in abi.HOST_IMPORTS.items():
            impl = getattr(self, "h_" + name.replace("-", "_"))
            ty = wasmtime.FuncType([wasmtime.ValType.i32()] * len(params), [wasmtime.ValType.i32()] * len(results))
            linker.define_func(abi.HOST_MODULE, name, ty, self._wrap(name, impl), access_caller=True)
        for name, ty in wasi_imports:
            linker.define_func(abi.WASI_MODULE, name, ty, self._wasi(name, ty), access_caller=True)

    def _wrap(self, name: str, impl):
        def call(caller, *args):
            seq = self._seq(caller)
            try:
                return impl(Guest(seq, caller, name), *args)
            except GuestFault:
                raise
            except Exception as e:  # a host-side failure still ends only this sequence
                _raise_fault(seq, f"host import `{name}` failed: {type(e).__name__}: {e}")
        return call

    # -- interface host ------------------------------------------------------------------------
    def h_vocab_size(self, g: Guest) -> int:
        return self.tokenizer.vocab_size

    def h_eos_token(self, g: Guest) -> int:
        return self.tokenizer.eos_token_id

    def h_token_trie(self, g: Guest, retptr: int) -> None:
        fresh = self._trie is None
        data = self.trie
        if fresh:  # building it (once per runtime, ~1 s at 150k tokens) is not the controller's time
            wt_ffi.wasmtime_context_set_epoch_deadline(g.caller._context(), g.seq._ticks_first)
        g.return_list(retptr, data, 1, len(data))

    def h_tokenize(self, g: Guest, ptr: int, n: int, retptr: int) -> None:
        ids = self.tokenizer.encode(g.read_str(ptr, n))
        g.return_list(retptr, struct.pack(f"<{len(ids)}I", *ids), 4, len(ids))

    def h_detokenize(self, g: Guest, ptr: int, n: int, retptr: int) -> None:
        ids = struct.unpack(f"<{n & 0xFFFFFFFF}I", g.read(ptr, (n & 0xFFFFFFFF) * 4))
        vocab = self.tokenizer.vocab_size
        bad = [t for t in ids if t >= vocab]
        if bad:
            _raise_fault(g.seq, f"host import `detokenize`: token id {bad[0]} >= vocab size {vocab}")
        data = self.tokenizer.decode_bytes(ids)
        g.return_list(retptr, data, 1, len(data))

    def h_arg(self, g: Guest, retptr: int) -> None:
        data = g.seq.request.arg
        g.return_list(retptr, data, 1, len(data))

    def h_self_seq_id(self, g: Guest) -> int:
        return g.seq.id

    def h_capabilities(self, g: Guest) -> int:
        return int(g.seq.request.capabilities)

    def h_var_get(self, g: Guest, ptr: int, n: int, retptr: int) -> None:
        value = g.seq.request.var_get(g.read_str(ptr, n))
        if value is None:
            g.write(retptr, b"\0" * 12)
        else:
            g.write(retptr, struct.pack("<III", 1, g.alloc(value, 1), len(value)))

    def h_var_set(self, g: Guest, nptr: int, nlen: int, vptr: int, vlen: int) -> None:
        g.seq.request.var_set(g.seq.id, g.read_str(nptr, nlen), g.read(vptr, vlen), append=False)

    def h_var_append(self, g: Guest, nptr: int, nlen: int, vptr: int, vlen: int) -> None:
        g.seq.request.var_set(g.seq.id, g.read_str(nptr, nlen), g.read(vptr, vlen), append=True)

    def h_log(self, g: Guest, ptr: int, n: int) -> None:
        g.seq.append_log(g.read(ptr, n))

    # -- wasi_snapshot_preview1: no real I/O ---------------------------------------------------
    def _wasi(self, name: str, ty: wasmtime.FuncType):
        results = [str(r) for r in ty.results]
        returns_errno = results == ["i32"]
        impl = getattr(self, "w_" + name, None)

        def call(caller, *args):
            seq = self._seq(caller)
            if impl is None:
                if returns_errno:
                    return _ENOSYS
                _raise_fault(seq, f"WASI function `{name}` is not available to controllers")
            try:
                return impl(Guest(seq, caller, name), *args)
            except GuestFault:
                raise
            except Exception as e:
                _raise_fault(seq, f"WASI function `{name}` failed: {type(e).__name__}: {e}")
        return call

    def w_fd_write(self, g: Guest, fd: int, iovs: int, n_iovs: int, nwritten: int) -> int:
        if fd not in (1, 2):
            return _EBADF
        total = 0
        for i in range(n_iovs & 0xFFFF):
            ptr, n = struct.unpack("<II", g.read(iovs + 8 * i, 8))
            g.seq.append_log(g.read(ptr, n))
            total += n
        g.write(nwritten, struct.pack("<I", total))
        return _ESUCCESS

    def w_fd_fdstat_get(self, g: Guest, fd: int, out: int) -> int:
        if fd not in (0, 1, 2):
            return _EBADF
        g.write(out, struct.pack("<BxHxxxxQQ", 2, 0, 0, 0))  # character device, no rights
        return _ESUCCESS

    def w_clock_time_get(self, g: Guest, clock: int, precision: int, out: int) -> int:
        g.write(out, struct.pack("<Q", 0))  # no clock: deterministic controllers
        return _ESUCCESS

    def w_args_sizes_get(self, g: Guest, argc: int, size: int) -> int:
        g.write(argc, b"\0" * 4)
        g.write(size, b"\0" * 4)
        return _ESUCCESS

    w_environ_sizes_get = w_args_sizes_get

    def w_args_get(self, g: Guest, *_):
        return _ESUCCESS

    w_environ_get = w_args_get

    def w_sched_yield(self, g: Guest) -> int:
        return _ESUCCESS

    def w_proc_exit(self, g: Guest, code: int) -> None:
        _raise_fault(g.seq, f"controller called proc_exit({code})")


def clear_stale_exception() -> None:
    """wasmtime-py parks a callback's exception in a module global; ours are reported per
    sequence, so drop it lest an unrelated wasmtime-py call re-raise it later."""
    if isinstance(wt_func.LAST_EXCEPTION, GuestFault):
        wt_func.LAST_EXCEPTION = None
