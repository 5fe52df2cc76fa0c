"""The Python side of WIT interface `host` and the `wasi_snapshot_preview1` shim (SPEC §2).

On the compiled hot path only `tokenize`, `detokenize`, `token-trie` and the WASI shim run here
(the per-step imports are native callbacks in native/host.c); on the Python fallback every
import does, with the same results and messages. Each import gets its sequence and a
bounds-checked view of its caller's memory; a guest that passes something invalid gets a trap
whose message says which import and why, recorded on its own sequence, and only that sequence ends.
"""
from __future__ import annotations

import struct
import threading
from typing import TYPE_CHECKING, Callable

import wasmtime

from . import abi
from .native.guest import AllocFailed, Guest, GuestFault

if TYPE_CHECKING:
    from .native import Native
    from .sequence import Sequence

_ENOSYS, _EBADF, _ESUCCESS = 52, 8, 0
_MAX_IOVS = 1024    # iovecs in one fd_write
Impl = Callable[..., "int | None"]


def _i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


class HostImports:
    """The host imports of one Runtime: registers its Python handlers with the hot path."""

    def __init__(self, native: "Native", tokenizer, lookup: Callable[[int], "Sequence"], host_arg_bytes: int) -> None:
        self.native = native
        self.tokenizer = tokenizer
        self.lookup = lookup
        self.arg_cap = host_arg_bytes
        self._trie: bytes | None = None
        self._trie_lock = threading.Lock()
        self._ids: dict[tuple, int] = {}

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

    # -- registration (native.linker.HostHandlers) ----------------------------------------------
    def handler_id(self, name: str) -> int:
        key = ("host", name)
        if key not in self._ids:
            params, results = abi.HOST_IMPORTS[name]
            self._ids[key] = self.native.add_handler(
                self._wrap(name, getattr(self, "h_" + name.replace("-", "_")), len(params), bool(results)))
        return self._ids[key]

    def wasi_handler_id(self, name: str, ty: wasmtime.FuncType) -> int:
        params, results = [str(p) for p in ty.params], [str(r) for r in ty.results]
        key = ("wasi", name, tuple(params), tuple(results))
        if key not in self._ids:
            impl = getattr(self, "w_" + name, None)
            if impl is None:
                impl = self._w_enosys if results == ["i32"] else self._w_unavailable
            self._ids[key] = self.native.add_handler(self._wrap(name, impl, len(params), bool(results), wasi=True))
        return self._ids[key]

    def close(self) -> None:
        for hid in self._ids.values():
            self.native.remove_handler(hid)
        self._ids.clear()

    def _wrap(self, name: str, impl: Impl, n_params: int, has_result: bool, wasi: bool = False):
        native, lookup, arg_cap = self.native, self.lookup, self.arg_cap
        what = f"WASI function `{name}`" if wasi else f"host import `{name}`"

        def handler(slot, ctx, args) -> int:
            try:
                seq = lookup(native.addr(slot))
                g = Guest(native, slot, ctx, name, arg_cap)
                r = impl(seq, g, *(args[i].i32 & 0xFFFFFFFF for i in range(n_params)))
                if has_result:
                    args[0].i32 = _i32(r or 0)
                return 0
            except AllocFailed:
                return 1
            except GuestFault as e:
                native.set_fault(slot, str(e))
            except Exception as e:  # a host-side failure still ends only this sequence
                native.set_fault(slot, f"{what} failed: {type(e).__name__}: {e}")
            return 1
        return handler

    # -- interface host --------------------------------------------------------------------------
    # The first five and the var/log ones are native callbacks on the compiled path (host.c);
    # these Python twins serve the fallback and read the same slot fields.
    def h_vocab_size(self, seq, g: Guest) -> int:
        return g.slot.vocab_size

    def h_eos_token(self, seq, g: Guest) -> int:
        return g.slot.eos_token

    def h_self_seq_id(self, seq, g: Guest) -> int:
        return g.slot.seq_id

    def h_capabilities(self, seq, g: Guest) -> int:
        return g.slot.capabilities

    def h_arg(self, seq, g: Guest, retptr: int) -> None:
        data = seq.request.arg
        g.return_list(retptr, data, 1, len(data))

    def h_var_get(self, seq, g: Guest, ptr: int, n: int, retptr: int) -> None:
        value = seq.request.vars.get(g.read_str(ptr, n))
        if value is None:
            g.write(retptr, b"\0" * abi.OPTION_LIST_SIZE)
        else:
            g.write(retptr, struct.pack("<III", 1, g.alloc(value, 1), len(value)))

    def _var_set(self, seq, g: Guest, nptr: int, nlen: int, vptr: int, vlen: int, append: bool) -> None:
        name, value = g.read_str(nptr, nlen), g.read(vptr, vlen)
        try:
            seq.request.vars.set(g.slot.seq_id, name, value, append)
        except ValueError as e:
            g.fail(str(e))

    def h_var_set(self, seq, g: Guest, nptr: int, nlen: int, vptr: int, vlen: int) -> None:
        self._var_set(seq, g, nptr, nlen, vptr, vlen, append=False)

    def h_var_append(self, seq, g: Guest, nptr: int, nlen: int, vptr: int, vlen: int) -> None:
        self._var_set(seq, g, nptr, nlen, vptr, vlen, append=True)

    def h_log(self, seq, g: Guest, ptr: int, n: int) -> None:
        self.native.log_append(g.slot, g.read(ptr, n))

    # Python on both paths: rare, and they need the tokenizer.
    def h_token_trie(self, seq, g: Guest, retptr: int) -> None:
        fresh = self._trie is None
        data = self.trie
        if fresh:  # building it (once per runtime, ~1 s at 150k tokens) is not the controller's time
            self.native.set_deadline(g.ctx, g.slot.first_call_ticks)
        g.return_list(retptr, data, 1, len(data))

    def h_tokenize(self, seq, g: Guest, ptr: int, n: int, retptr: int) -> None:
        ids = self.tokenizer.encode(g.read_str(ptr, n))
        g.return_list(retptr, struct.pack(f"<{len(ids)}I", *ids), 4, len(ids))

    def h_detokenize(self, seq, g: Guest, ptr: int, n: int, retptr: int) -> None:
        ids = struct.unpack(f"<{n}I", g.read(ptr, n * 4))
        vocab = self.tokenizer.vocab_size
        bad = [t for t in ids if t >= vocab]
        if bad:
            g.fail(f"token id {bad[0]} >= vocab size {vocab}")
        data = self.tokenizer.decode_bytes(ids)
        g.return_list(retptr, data, 1, len(data))

    # -- wasi_snapshot_preview1: no real I/O -----------------------------------------------------
    def _w_enosys(self, seq, g: Guest, *_) -> int:
        return _ENOSYS

    def _w_unavailable(self, seq, g: Guest, *_) -> None:
        raise GuestFault(f"WASI function `{g.name}` is not available to controllers")

    def w_fd_write(self, seq, g: Guest, fd: int, iovs: int, n_iovs: int, nwritten: int) -> int:
        if fd not in (1, 2):
            return _EBADF
        if n_iovs > _MAX_IOVS:   # host work is not interruptible: bound it
            g.fail(f"{n_iovs} iovecs is over the limit of {_MAX_IOVS}")
        total = 0
        for ptr, n in struct.iter_unpack("<II", g.read(iovs, 8 * n_iovs)):
            total += n
            if total > g.arg_cap:
                g.fail(f"writes {total} bytes or more, over the limit of {g.arg_cap} (Limits.host_arg_bytes)")
            self.native.log_append(g.slot, g.read(ptr, n))
        g.write(nwritten, struct.pack("<I", total))
        return _ESUCCESS

    def w_fd_fdstat_get(self, seq, g: Guest, fd: int, out: int) -> int:
        if fd not in (0, 1, 2):
            return _EBADF
        g.write(out, struct.pack("<BxHxxxxQQ", 2, 0, 0, 0))  # character device, no rights
        return _ESUCCESS

    def w_clock_time_get(self, seq, g: Guest, clock: int, precision: int, out: int) -> int:
        g.write(out, struct.pack("<Q", 0))  # no clock: deterministic controllers
        return _ESUCCESS

    def w_args_sizes_get(self, seq, g: Guest, argc: int, size: int) -> int:
        g.write(argc, b"\0" * 4)
        g.write(size, b"\0" * 4)
        return _ESUCCESS

    w_environ_sizes_get = w_args_sizes_get

    def w_args_get(self, seq, g: Guest, *_) -> int:
        return _ESUCCESS

    w_environ_get = w_args_get

    def w_sched_yield(self, seq, g: Guest) -> int:
        return _ESUCCESS

    def w_proc_exit(self, seq, g: Guest, code: int) -> None:
        raise GuestFault(f"controller called proc_exit({code})")
