"""WASI preview 1 (`wasi_snapshot_preview1`) for controllers, in Python (docs/wasi.md).

The hot path runs these functions natively (runtime/native/wasi.c); this module is the same logic
for the template instance of a per-tokenizer init (runtime/loader/snapshot.py), with the same results
and the same messages:

- clocks are virtual: every clock reads ``calls`` ms, the mid-process calls started so far on the
  sequence (zero in an init), resolution 1 ms: time moves one millisecond a step, never within a
  call, so a controller's results do not depend on when it runs;
- ``random_get``: a splitmix64 stream seeded from the request's argument, split at a fork
  (:mod:`aicirt.native.wasi_rng`): a replayed request reads the same bytes (not cryptographic);
- ``fd_write`` to 1 and 2 appends to the sequence's log; other fds: ``EBADF``;
- args and environment are empty; ``fd_fdstat_get``: 0-2 are character devices, others ``EBADF``;
- ``proc_exit(code)`` ends the sequence in error, quoting the last entry of the call's log
  (:func:`exit_message`);
- anything else (files, sockets, poll, ...) returns ``ENOSYS``; the one without a result
  (``proc_raise``-like) ends the sequence, naming the function.

Bounds: one ``fd_write`` takes at most 1024 iovecs and Limits.host_arg_bytes bytes, one
``random_get`` at most Limits.host_arg_bytes; past them, or a pointer outside linear memory, the
sequence ends with a message naming the function.
"""
from __future__ import annotations

import struct
from typing import Callable, NoReturn, Protocol

from ..native.wasi_rng import random_bytes, seed

ESUCCESS, EBADF, EINVAL, ENOSYS = 0, 8, 28, 52
CLOCK_NS = 1_000_000        # one virtual millisecond a call
MAX_IOVS = 1024
_MAX_CLOCK_ID = 3
_FAULT_BYTES = 255          # native.Native.FAULT_BYTES: the message is cut to it


class WasiIO(Protocol):
    """What a WASI function needs of its caller: guest memory, the sequence's state, its log."""

    arg_cap: int
    name: str                               # the WASI function being called (for messages)

    def read(self, ptr: int, n: int) -> bytes: ...
    def write(self, ptr: int, data: bytes) -> None: ...
    def fail(self, message: str) -> NoReturn: ...
    def log(self, data: bytes) -> None: ...
    def calls(self) -> int: ...             # mid-process calls started so far (0 in an init)
    def arg(self) -> bytes: ...             # the request's argument (b"" in an init)
    def rng(self) -> int: ...               # the random stream's state; 0: not seeded
    def set_rng(self, state: int) -> None: ...
    def call_log(self) -> bytes: ...        # what this call has logged so far


def exit_message(code: int, call_log: bytes) -> str:
    """proc_exit's error: the last entry of the call's log (its last line that does not begin
    with a space, and the indented lines after it, joined by " | "), cut to the fault's size."""
    head = f"controller exited with proc_exit({code})"
    lines = call_log.rstrip(b"\n \t").split(b"\n")
    start = len(lines) - 1
    while start > 0 and lines[start][:1] in (b" ", b"\t"):
        start -= 1
    entry = [lines[start]] + [ln.lstrip(b" \t") for ln in lines[start + 1:]]
    tail = b" | ".join(entry)[:_FAULT_BYTES - len(head) - 2] if lines != [b""] else b""
    text = tail.decode("utf-8", "ignore")
    return f"{head}: {text}" if text else head


def clock_time_get(io: WasiIO, clock: int, precision: int, out: int) -> int:
    io.write(out, struct.pack("<Q", io.calls() * CLOCK_NS))
    return EINVAL if clock > _MAX_CLOCK_ID else ESUCCESS


def clock_res_get(io: WasiIO, clock: int, out: int) -> int:
    if clock > _MAX_CLOCK_ID:
        return EINVAL
    io.write(out, struct.pack("<Q", CLOCK_NS))
    return ESUCCESS


def random_get(io: WasiIO, buf: int, n: int) -> int:
    if n > io.arg_cap:
        io.fail(f"WASI function `random_get`: {n} bytes is over the limit of {io.arg_cap} (Limits.host_arg_bytes)")
    io.read(buf, n)   # bounds-checked first: nothing is drawn for a bad range
    state, data = random_bytes(io.rng() or seed(io.arg()), n)
    io.set_rng(state)
    io.write(buf, data)
    return ESUCCESS


def fd_write(io: WasiIO, fd: int, iovs: int, n_iovs: int, nwritten: int) -> int:
    if fd not in (1, 2):
        return EBADF
    if n_iovs > MAX_IOVS:   # host work is not interruptible: bound it
        io.fail(f"WASI function `fd_write`: {n_iovs} iovecs is over the limit of {MAX_IOVS}")
    total = 0
    for ptr, n in struct.iter_unpack("<II", io.read(iovs, 8 * n_iovs)):
        total += n
        if total > io.arg_cap:
            io.fail(f"WASI function `fd_write`: writes {total} bytes or more, over the limit of {io.arg_cap} "
                    f"(Limits.host_arg_bytes)")
        io.log(io.read(ptr, n))
    io.write(nwritten, struct.pack("<I", total))
    return ESUCCESS


def fd_fdstat_get(io: WasiIO, fd: int, out: int) -> int:
    if fd > 2:
        return EBADF
    io.write(out, struct.pack("<BxHxxxxQQ", 2, 0, 0, 0))  # character device, no flags, no rights
    return ESUCCESS


def sizes_get(io: WasiIO, count: int, size: int) -> int:
    io.write(count, b"\0" * 4)
    io.write(size, b"\0" * 4)
    return ESUCCESS


def success(io: WasiIO, *_: int) -> int:
    return ESUCCESS


def proc_exit(io: WasiIO, code: int) -> NoReturn:
    io.fail(exit_message(code - (1 << 32) if code >= 1 << 31 else code, io.call_log()))


def enosys(io: WasiIO, *_: int) -> int:
    return ENOSYS


def unavailable(io: WasiIO, *_: int) -> NoReturn:
    io.fail(f"WASI function `{io.name}` is not available to controllers")


FUNCTIONS: dict[str, Callable[..., "int | None"]] = {
    "clock_time_get": clock_time_get, "clock_res_get": clock_res_get, "random_get": random_get,
    "fd_write": fd_write, "fd_fdstat_get": fd_fdstat_get,
    "args_sizes_get": sizes_get, "environ_sizes_get": sizes_get,
    "args_get": success, "environ_get": success, "sched_yield": success,
    "proc_exit": proc_exit,
}
#: The functions wasi.c runs natively on the compiled path (the rest come here on both paths).
NATIVE = frozenset(FUNCTIONS)


def function(name: str, returns: bool) -> Callable[..., "int | None"]:
    """The implementation of WASI function `name` (args: the io, then the core arguments as
    unsigned ints); ENOSYS for one we do not provide, or a fault if it returns nothing."""
    return FUNCTIONS.get(name) or (enosys if returns else unavailable)
