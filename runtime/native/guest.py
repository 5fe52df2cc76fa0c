"""Guest memory for a host import implemented in Python: bounds-checked reads, writes and
allocations through the guest's cabi_realloc, on the calling store's context."""
from __future__ import annotations

import ctypes
import struct
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from . import Native


class GuestFault(Exception):
    """The guest passed something invalid to a host import; becomes a trap for its sequence only."""


class AllocFailed(GuestFault):
    """cabi_realloc failed inside a host import; what to report is already in the slot."""


class Guest:
    """One host call's view of its caller's memory. `name` is the import, for messages."""

    __slots__ = ("native", "slot", "ctx", "name", "arg_cap", "base", "size")

    def __init__(self, native: "Native", slot, ctx, name: str, arg_cap: int) -> None:
        self.native, self.slot, self.ctx, self.name, self.arg_cap = native, slot, ctx, name, arg_cap
        self.base: int
        self.size: int
        self.base, self.size = native.ctx_memory(slot, ctx)

    def fail(self, message: str) -> NoReturn:
        raise GuestFault(f"host import `{self.name}`: {message}")

    def _check(self, ptr: int, n: int) -> None:
        if ptr + n > self.size:
            self.fail(f"range [{ptr}, {ptr + n}) is outside linear memory ({self.size} bytes)")

    def read(self, ptr: int, n: int) -> bytes:
        ptr &= 0xFFFFFFFF
        n &= 0xFFFFFFFF
        if n > self.arg_cap:   # host work happens under the GIL, where the epoch limit cannot stop it
            self.fail(f"an argument of {n} bytes is over the limit of {self.arg_cap} (Limits.host_arg_bytes)")
        self._check(ptr, n)
        return ctypes.string_at(self.base + ptr, n)

    def read_str(self, ptr: int, n: int) -> str:
        raw = self.read(ptr, n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail("string is not valid UTF-8")

    def write(self, ptr: int, data: bytes) -> None:
        ptr &= 0xFFFFFFFF
        self._check(ptr, len(data))
        ctypes.memmove(self.base + ptr, data, len(data))

    def alloc(self, data: bytes, align: int) -> int:
        """Copy `data` into memory the guest allocates with cabi_realloc; returns its pointer."""
        if not data:
            return 0
        ptr = self.native.ctx_alloc(self.slot, self.ctx, align, len(data), self.name)
        if ptr < 0:
            raise AllocFailed(self.name)
        self.base, self.size = self.native.ctx_memory(self.slot, self.ctx)   # realloc may have grown memory
        self.write(ptr, data)
        return ptr

    def return_list(self, retptr: int, data: bytes, align: int, count: int) -> None:
        self.write(retptr, struct.pack("<II", self.alloc(data, align), count))
