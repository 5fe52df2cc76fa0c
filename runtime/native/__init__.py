"""The FFI layer: every call into libwasmtime below wasmtime-py's public API is in this package.

One hot path (:mod:`.compiled`): the C in this folder (step.c's step and lift, clock.c's CPU
clocks, pool.c's worker pool, rows.c's rows API, host.c's native imports and variables, wasi.c,
pages.c, spawn.c), built once and cached under the user cache dir (:mod:`.build`); pthread
workers run sequence-steps with the GIL released (~1 µs a sequence-step), and the per-step host
imports are native callbacks. The fuzzer's harness (:mod:`aicirt.testing`) is the independent
oracle of its protocol.

It calls into the very libwasmtime that wasmtime-py loaded, so handles made with wasmtime-py
(stores, funcs, memories) are valid here. One concept a module: :mod:`.build` (compiling the C),
:mod:`.traps` (trap text), :mod:`.guest` (guest memory for Python host imports), :mod:`.linker`
(defining host imports), :mod:`.instance` (stores, fork copies), :mod:`.engine_config`.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import cffi
import numpy as np
from wasmtime import _ffi as wt_ffi

from ..abi import Status
from .build import resolve_all
from .compiled import Compiled
from .ffi_decl import CDEF_SLOT, CDEF_VARS, CDEF_WASMTIME
from .traps import summarize_trap, take_error_text
from .types import CData, CLib

__all__ = ["EditArrays", "Native", "RowScratch", "ScratchBuffers", "Status", "get_native", "summarize_trap"]


class RowScratch:
    """A batch's arrays in one buffer, handed to the hot path once (rows.c's scratch layout, for
    `n` rows): `blocked_us` (float64 [1]: the time the wait blocked), `slots` (uint64 slot
    addresses), `elapsed_us` (float64), `temperature` (float32), `row_status` (int8,
    RowStatus), `kind` (uint8, RowKind). `held` is the hot path's handle on `buf` (made by the
    pool on first use, kept); `busy`: a batch not yet waited for uses it."""

    __slots__ = ("n", "buf", "blocked_us", "slots", "elapsed_us", "temperature", "row_status", "kind", "held",
                 "busy")

    def __init__(self, n: int) -> None:
        self.n = n
        b = self.buf = np.empty(8 + 22 * n, dtype=np.uint8)
        self.blocked_us = b[:8].view(np.float64)
        self.slots = b[8:8 + 8 * n].view(np.uint64)
        self.elapsed_us = b[8 + 8 * n:8 + 16 * n].view(np.float64)
        self.temperature = b[8 + 16 * n:8 + 20 * n].view(np.float32)
        self.row_status = b[8 + 20 * n:8 + 21 * n].view(np.int8)
        self.kind = b[8 + 21 * n:]
        self.held: Any = None
        self.busy = False


class ScratchBuffers:
    """Two RowScratch per batch size, used in turn, for the `sizes` sizes used last (a fresh one
    costs about 2.4 µs, as much as the rest of a small batch's submit). An outcome's per-row
    arrays are views into its batch's scratch, so, as its masks, they stay valid until the
    next-but-one submit; a scratch whose batch has not been waited for is never handed out."""

    def __init__(self, sizes: int = 8) -> None:
        self._sizes = sizes
        self._pairs: OrderedDict[int, list[Any]] = OrderedDict()   # n -> [scratch, scratch, turn]
        self._last: tuple[int, list[Any]] = (-1, [])   # the last size taken and its pair (the newest already)

    def take(self, n: int) -> RowScratch:
        """A scratch for `n` rows, marked busy (the batch clears `busy` at its wait)."""
        last_n, pair = self._last
        if n != last_n:   # (the same size as the last batch's is the most recent in the order already)
            got = self._pairs.get(n)
            if got is None:
                pair = self._pairs[n] = [None, None, 0]
                if len(self._pairs) > self._sizes:
                    self._pairs.popitem(last=False)
            else:
                pair = got
                self._pairs.move_to_end(n)
            self._last = (n, pair)
        turn = pair[2] = pair[2] ^ 1
        scratch = pair[turn]
        if scratch is None or scratch.busy:   # a batch not waited for keeps its own
            scratch = pair[turn] = RowScratch(n)
        scratch.busy = True
        return scratch


@dataclass(frozen=True)
class EditArrays:
    """The rows of a batch whose token list changed otherwise than by appending the sampled token
    (a prompt, a splice, a fork's branch): `of_row[i]` is row i's edit (-1: none). Edit e says the
    sequence's tokens are the first `unchanged[e]` the controller saw, then
    `tokens[offsets[e]:offsets[e + 1]]`; the hot path diffs that against what the controller saw,
    so the controller gets the least net edit. `unchanged[e]` may be 0 (the whole list)."""
    of_row: np.ndarray      # int32 [rows]
    offsets: np.ndarray     # int64 [edits + 1]
    tokens: np.ndarray      # uint32
    unchanged: np.ndarray   # uint32 [edits]


# A Python host import: (slot, ctx, args) -> 0, or 1 with the fault written into the slot.
Handler = Callable[[CData, CData, CData], int]


class Native:
    """The loaded hot path (``mode`` is "compiled", the only one); ``ffi`` allocates slots."""

    FAULT_BYTES = 255

    def __init__(self) -> None:
        self.wt = cffi.FFI()
        self.wt.cdef(CDEF_SLOT + CDEF_VARS + CDEF_WASMTIME)
        self.wtlib: CLib = resolve_all(self.wt.dlopen(str(wt_ffi.filename)))   # see resolve_all
        try:
            impl = Compiled(self)
        except Exception as e:
            raise RuntimeError(f"aicirt: the C hot path could not be built or loaded: {e}") from e
        self.impl: Compiled = impl   # the one typed seam between Python and the pool (compiled.py)
        self.mode: str = impl.mode
        self.ffi = impl.ffi
        self.slot_bytes: int = impl.ffi.sizeof("aicirt_slot")
        self._slot_p, self._uintptr = impl.ffi.typeof("aicirt_slot *"), impl.ffi.typeof("uintptr_t")   # parsed once
        # the hot operations, bound once (no extra Python frame per call)
        self.make_pool = impl.make_pool
        self.memory = impl.memory
        self.check_mask = impl.check_mask
        self.new_vars = impl.new_vars
        self.log_append = impl.log_append
        self.release = impl.release
        self.spawn = impl.spawn                 # (plan, slot) -> 0, or 1 with the reason in the slot (instance.py)
        self.fork_copy = impl.fork_copy         # (plan, src, dst) -> pages written, or -1 with the reason in dst
        self.store_delete = impl.store_delete   # (slot): free its Store; idempotent
        self.ctx_memory = impl.ctx_memory
        self.ctx_alloc = impl.ctx_alloc
        self.host_callback = impl.host_callback
        self.wasi_callback = impl.wasi_callback   # (name) -> native WASI callback, or 0
        self.seen_tokens = impl.seen_tokens
        self.copy_seen = impl.copy_seen
        self.collect_rows = impl.collect_rows
        self.gather_rows = impl.gather_rows
        self.clock_start = impl.clock_start     # (slot, budget_us): the running call's clocks, on its thread
        self.call_cpu_us = impl.call_cpu_us     # (slot) -> µs of CPU its call has used (any thread)
        self.epoch_callback = impl.epoch_callback

    # -- slots ---------------------------------------------------------------------------------
    def new_slot(self) -> CData:
        return self.ffi.new(self._slot_p)

    def addr(self, cdata: CData) -> int:
        return int(self.ffi.cast(self._uintptr, cdata))

    def log_bytes(self, slot: CData) -> bytes:
        return bytes(self.ffi.buffer(slot.log, slot.log_len)) if slot.log_len else b""

    def take_call_log(self, slot: CData) -> bytes:
        n = slot.call_log_len
        if not n:
            return b""
        slot.call_log_len = 0
        return bytes(self.ffi.buffer(slot.log + (slot.log_len - n), n))

    @staticmethod
    def defer_post(slot: CData) -> None:
        """A lifted result's post-return: the worker runs it first thing in the sequence's next
        call, on what its call left of the time limit (never on the engine's thread, never on a
        fresh limit). A fork copies the pending post-return with the state it belongs to."""
        if slot.has_post:
            slot.post_pending = 1
            slot.post_ptr = slot.result_ptr
            slot.post_left_us = slot.budget_us - slot.cpu_us   # the limit counts CPU time (docs/protocol.md#limits)

    def late_is_own(self, slot: CData, late_steps: int, soft_deadline_s: float) -> bool:
        """Whether one more late step of a call still running at the soft deadline counts as the
        controller's own (docs/protocol.md#limits): only CPU time counts, so the k-th counted late step needs k soft
        deadlines of CPU (`call_cpu_us`). A call late because the machine gave it no CPU, because
        it waited for its turn among stalled calls, or because it is still queued, is not; with
        `late_steps` counted already, this one counts once the call has used
        (late_steps + 1) x `soft_deadline_s` of CPU."""
        return self.call_cpu_us(slot) >= (late_steps + 1) * soft_deadline_s * 1e6

    def set_fault(self, slot: CData, message: str) -> None:
        data = message.encode("utf-8", "replace")[:self.FAULT_BYTES]
        self.ffi.memmove(slot.fault, data, len(data))
        slot.fault_len = len(data)

    def fault_text(self, slot: CData) -> str | None:
        n = slot.fault_len
        return bytes(self.ffi.buffer(slot.fault, n)).decode("utf-8", "replace") if n else None

    def error_text(self, slot: CData) -> str:
        """Why a call failed: the host import's fault if one trapped the guest, else the trap /
        wasmtime error text (both freed here)."""
        trap, err = self.addr(slot.trap), self.addr(slot.error)
        slot.trap = slot.error = self.ffi.NULL
        text = take_error_text(self.wt, self.wtlib, trap, err)
        return self.fault_text(slot) or text

    def set_deadline(self, ctx: CData, ticks: int) -> None:
        """From a host import, on the call's thread: give the running call a fresh time limit of
        `ticks` epoch ticks (of CPU time, from now), e.g. after host work that is not its own."""
        slot = self.ffi.cast("aicirt_slot *", self.addr(self.wtlib.wasmtime_context_get_data(
            self.wt.cast("void *", self.addr(ctx)))))
        self.clock_start(slot, ticks * slot.tick_us)

    # -- Python host imports: one process-wide registry, as the C trampoline is one symbol -----
    @staticmethod
    def add_handler(handler: Handler) -> int:
        with _handlers_lock:
            hid = next(_handler_ids)
            _handlers[hid] = handler
            return hid

    @staticmethod
    def remove_handler(hid: int) -> None:
        with _handlers_lock:
            _handlers.pop(hid, None)

    def dispatch(self, hid: int, slot: CData, ctx: CData, args: CData) -> int:
        """Run Python host import `hid` (called by the hot path's trampoline); 0 or 1 (fault)."""
        handler = _handlers.get(hid)
        if handler is None:
            self.set_fault(slot, "host import called after its runtime was closed")
            return 1
        return handler(slot, ctx, args)


_handlers: dict[int, Handler] = {}
_handler_ids = itertools.count(1)
_handlers_lock = threading.Lock()
_native: Native | None = None
_lock = threading.Lock()


def get_native() -> Native:
    """The process-wide hot path (built or loaded on first use; thread-safe)."""
    global _native
    with _lock:
        if _native is None:
            _native = Native()
        return _native
