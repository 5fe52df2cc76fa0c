"""The Python side of WIT interface `host` and of `wasi_snapshot_preview1` (docs/protocol.md#wit, docs/wasi.md).

In the hot path only `tokenize`, `detokenize`, `token-trie` and the WASI functions wasi.c lacks
(ENOSYS) run here (the per-step imports are native callbacks in native/host.c and native/wasi.c).
Each import gets its sequence and a bounds-checked view of its caller's memory; a guest that passes something invalid gets a trap
whose message says which import and why, recorded on its own sequence, and only that sequence ends.
"""
from __future__ import annotations

import struct
import threading
from typing import TYPE_CHECKING, Callable, NoReturn

import wasmtime

from .. import abi
from . import wasi
from ..native.guest import AllocFailed, Guest, GuestFault
from ..native.types import CData

if TYPE_CHECKING:
    from ..native import Handler, Native
    from ..core.sequence import Sequence
    from .tokenizer import Tokenizer

Impl = Callable[..., "int | None"]


def _i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


class HostImports:
    """The host imports of one Runtime: registers its Python handlers with the hot path."""

    def __init__(self, native: "Native", tokenizer: Tokenizer, lookup: Callable[[int], "Sequence"],
                 host_arg_bytes: int) -> None:
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
            impl = self._wasi(name, results == ["i32"])
            self._ids[key] = self.native.add_handler(self._wrap(name, impl, len(params), bool(results), wasi=True))
        return self._ids[key]

    def close(self) -> None:
        for hid in self._ids.values():
            self.native.remove_handler(hid)
        self._ids.clear()

    def _wrap(self, name: str, impl: Impl, n_params: int, has_result: bool, wasi: bool = False) -> Handler:
        native, lookup, arg_cap = self.native, self.lookup, self.arg_cap
        what = f"WASI function `{name}`" if wasi else f"host import `{name}`"

        def handler(slot: CData, ctx: CData, args: CData) -> int:
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
    # abi.NATIVE_IMPORTS are native callbacks (host.c); these take the GIL: rare, and they need
    # the tokenizer.
    def h_token_trie(self, seq: "Sequence", g: Guest, retptr: int) -> None:
        fresh = self._trie is None
        data = self.trie
        if fresh:  # building it (once per runtime, ~1 s at 150k tokens) is not the controller's time
            self.native.set_deadline(g.ctx, g.slot.first_call_ticks)
        g.return_list(retptr, data, 1, len(data))

    def h_tokenize(self, seq: "Sequence", g: Guest, ptr: int, n: int, retptr: int) -> None:
        ids = self.tokenizer.encode(g.read_str(ptr, n))
        g.return_list(retptr, struct.pack(f"<{len(ids)}I", *ids), 4, len(ids))

    def h_detokenize(self, seq: "Sequence", g: Guest, ptr: int, n: int, retptr: int) -> None:
        ids = struct.unpack(f"<{n}I", g.read(ptr, n * 4))
        vocab = self.tokenizer.vocab_size
        bad = [t for t in ids if t >= vocab]
        if bad:
            g.fail(f"token id {bad[0]} >= vocab size {vocab}")
        data = self.tokenizer.decode_bytes(ids)
        g.return_list(retptr, data, 1, len(data))

    # -- wasi_snapshot_preview1 (runtime/host/wasi.py where wasi.c lacks the function) ------------------
    def _wasi(self, name: str, returns: bool) -> Impl:
        impl = wasi.function(name, returns)
        native = self.native

        def call(seq: "Sequence", g: Guest, *args: int) -> "int | None":
            return impl(_WasiGuest(native, g), *args)
        return call


class _WasiGuest:
    """runtime/host/wasi.py's view of a call (wasi.WasiIO) over a Python host import's Guest."""

    __slots__ = ("native", "g", "arg_cap", "name")

    def __init__(self, native: "Native", g: Guest) -> None:
        self.native, self.g, self.arg_cap, self.name = native, g, g.arg_cap, g.name

    def read(self, ptr: int, n: int) -> bytes:
        return self.g.read(ptr, n)

    def write(self, ptr: int, data: bytes) -> None:
        self.g.write(ptr, data)

    def fail(self, message: str) -> NoReturn:
        raise GuestFault(message)

    def log(self, data: bytes) -> None:
        self.native.log_append(self.g.slot, data)

    def calls(self) -> int:
        return int(self.g.slot.calls)

    def arg(self) -> bytes:
        s = self.g.slot
        return bytes(self.native.ffi.buffer(s.arg, s.arg_len)) if s.arg_len else b""

    def rng(self) -> int:
        return int(self.g.slot.wasi_rng)

    def set_rng(self, state: int) -> None:
        self.g.slot.wasi_rng = state

    def call_log(self) -> bytes:
        s = self.g.slot
        n = min(s.call_log_len, s.log_len)
        return bytes(self.native.ffi.buffer(s.log + (s.log_len - n), n)) if n else b""
