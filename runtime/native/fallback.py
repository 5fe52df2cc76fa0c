"""step.c's and host.c's logic in Python over cffi's ABI mode, for machines that cannot compile them.

Same slot struct, same statuses, same results, same messages; keep it in step with the C line
for line. Every host import is a Python callback here (with the GIL), variables live in Python.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, cast

import numpy as np
import wasmtime

from .. import abi
from ..abi import RowKind, RowStatus, Stage, Status
from . import pages, wasi_rng
from .epoch_clock import EpochClock
from .pool_stats import PoolStats
from .types import CData

if TYPE_CHECKING:
    from . import EditArrays, Native, RowScratch
    from .instance import SpawnPlan

_EXTERN_FUNC, _EXTERN_GLOBAL, _EXTERN_MEMORY = 0, 1, 3   # WASMTIME_EXTERN_* (spawn.c)

# Host imports nested in one another on a thread (each cabi_realloc that calls a host import is
# one level, about ten Python frames here): far below Python's recursion limit, far above any use.
MAX_NESTED_IMPORTS = 16


def escaped_text(exc: BaseException, tb: object) -> str:
    """A fault for an exception that escaped a host import's handler, in the handler's own words
    ("host import `name` failed: Type: message"); the name from the handler's frame if it ran."""
    what = "host import"
    while tb is not None:
        what = tb.tb_frame.f_locals.get("what", what)  # type: ignore[attr-defined]
        tb = tb.tb_next  # type: ignore[attr-defined]
    return f"{what} failed: {type(exc).__name__}: {exc}"


class Fallback:
    mode = "python"

    def __init__(self, native: "Native") -> None:
        self.native = native
        self.ffi, self.lib = native.wt, native.wtlib
        # cffi parses a type string on its first use (pycparser, ~2 ms each): do it here, not in
        # a sequence's first call, where it would count against the soft deadline
        for t in ("aicirt_slot *", "intptr_t", "uint32_t *", "uint32_t[]", "uint8_t *", "uint8_t[]", "uintptr_t",
                  "wasm_trap_t *", "wasm_trap_t **", "wt_val_raw_t[1]", "wt_val_raw_t[4]", "wt_val_raw_t[7]"):
            self.ffi.typeof(t)

        nesting = threading.local()

        def fail(caller: CData, text: str) -> CData:
            """The import's trap, with `text` as its sequence's fault."""
            ctx = self.lib.wasmtime_caller_context(caller)
            slot: CData = self.ffi.cast("aicirt_slot *", self.lib.wasmtime_context_get_data(ctx))
            native.set_fault(slot, text)
            return self.lib.wasmtime_trap_new(slot.fault, slot.fault_len)

        def on_error(exc_type: type, exc: BaseException, tb: object) -> CData:
            # cffi's last word for an exception that left the trampoline (else it prints it and
            # returns NULL: a success); the trampoline's own frame holds `caller`
            return fail(tb.tb_frame.f_locals["caller"], escaped_text(exc, tb))  # type: ignore[attr-defined]

        # types-cffi's onerror returns None; cffi uses its return value as the callback's
        @self.ffi.callback("wasm_trap_t *(void *, void *, wt_val_raw_t *, size_t)",
                           onerror=on_error)  # type: ignore[arg-type]
        def trampoline(env: CData, caller: CData, args: CData, n: int) -> CData:
            # a host import whose cabi_realloc calls host imports nests Python frames: fail it
            # while there is room, not at Python's recursion limit, where the failure could not run
            depth = nesting.__dict__.get("depth", 0)
            if depth >= MAX_NESTED_IMPORTS:
                return fail(caller, f"host import failed: RecursionError: host imports nested over "
                                    f"{MAX_NESTED_IMPORTS} deep (a cabi_realloc calling host imports)")
            nesting.depth = depth + 1
            try:
                ctx = self.lib.wasmtime_caller_context(caller)
                slot: CData = self.ffi.cast("aicirt_slot *", self.lib.wasmtime_context_get_data(ctx))
                if not native.dispatch(int(self.ffi.cast("intptr_t", env)), slot, ctx, args):
                    return self.ffi.NULL
                trap, slot.host_trap = slot.host_trap, self.ffi.NULL
                return self.ffi.cast("wasm_trap_t *", trap) if trap != self.ffi.NULL else \
                    self.lib.wasmtime_trap_new(slot.fault, slot.fault_len)
            finally:
                nesting.depth = depth

        # a cdata at run time (types-cffi says the decorated function); kept alive as long as this object
        self._trampoline: CData = trampoline

        @self.ffi.callback("wt_epoch_cb")
        def on_epoch(ctx: CData, data: CData, delta: CData, kind: CData) -> CData:
            return self._on_epoch(self.ffi.cast("aicirt_slot *", data), delta, kind)

        self._on_epoch_cb: CData = on_epoch   # a cdata at run time, as `trampoline`; kept alive here

    @property
    def epoch_callback(self) -> int:
        """The epoch-deadline callback's address, for wasmtime_store_epoch_deadline_callback."""
        return int(self.ffi.cast("uintptr_t", self._on_epoch_cb))

    # -- the hard time limits, in CPU time (step.c's clock section) ------------------------------
    def clock_start(self, s: CData, budget_us: float) -> None:
        """step.c's aicirt_clock_start: the running call's clocks, on the calling thread."""
        s.cpu_clock = time.pthread_getcpuclockid(threading.get_ident())
        s.cpu_start_ns = time.thread_time_ns()
        s.cpu_budget_us = budget_us
        s.wall_start_us = time.perf_counter() * 1e6
        self.lib.wasmtime_context_set_epoch_deadline(s.ctx, 1)

    @staticmethod
    def call_cpu_us(s: CData) -> float:
        """step.c's aicirt_call_cpu_us."""
        if not s.started:
            return 0.0
        if s.done:
            return float(s.cpu_us)
        start = s.cpu_start_ns
        try:
            now = time.clock_gettime_ns(s.cpu_clock)
        except OSError:   # its thread just left: the call is done
            return float(s.cpu_us)
        return float(s.cpu_us) if s.done else max(0.0, (now - start) / 1e3)

    def call_own_us(self, s: CData) -> float:
        """step.c's aicirt_call_own_us."""
        if not s.started:
            return 0.0
        since = s.turn_wait_since_us
        return self.call_cpu_us(s) + s.turn_wait_us + (time.perf_counter() * 1e6 - since if since > 0 else 0.0)

    def _on_epoch(self, s: CData, delta: CData, kind: CData) -> CData:
        """step.c's aicirt_epoch_cb."""
        cpu = (time.thread_time_ns() - s.cpu_start_ns) / 1e3
        now = time.perf_counter() * 1e6
        wall = now - s.wall_start_us
        limit = max(s.budget_us, s.cpu_budget_us)
        delta[0], kind[0] = 1, 0
        if cpu >= s.cpu_budget_us or (s.wall_factor > 0 and wall >= s.wall_factor * limit):
            return self._limit_error(s, cpu, wall)
        pool = getattr(_worker, "pool", None)
        if pool is not None:   # waiting for its turn is the pool's doing, not the machine's
            s.wall_start_us += pool.stalled_turn(s, now / 1e6, cpu / 1e6) * 1e6
        return self.ffi.NULL

    def _limit_error(self, s: CData, cpu_us: float, wall_us: float) -> CData:
        """step.c's limit_error."""
        first = s.calls <= 1   # counted when the call was queued
        which = "its first call" if first else "one call"
        limit = "Limits.first_call_timeout_s" if first else "Limits.call_timeout_s"
        if cpu_us >= s.cpu_budget_us:
            msg = (f"trap: interrupted: controller used {cpu_us / 1e6:.2f} s of CPU in {which}, "
                   f"over its time limit of {s.cpu_budget_us / 1e6:g} s ({limit})")
        else:
            msg = (f"trap: interrupted: {which} ran {wall_us / 1e6:.1f} s of wall-clock time with "
                   f"{cpu_us / 1e6:.2f} s of CPU (the machine is too busy): the time limit's backstop "
                   f"(Limits.wall_backstop_factor x {limit})")
        self.native.set_fault(s, msg)
        return self.lib.wasmtime_error_new(msg.encode("utf-8"))

    # -- memory and calls ------------------------------------------------------------------------
    def memory(self, s: CData) -> tuple[int, int]:
        return self.ctx_memory(s, s.ctx)

    def ctx_memory(self, s: CData, ctx: CData) -> tuple[int, int]:
        mem = self.ffi.addressof(s, "mem")
        ptr = self.lib.wasmtime_memory_data(ctx, mem)
        return int(self.ffi.cast("uintptr_t", ptr)), self.lib.wasmtime_memory_data_size(ctx, mem)

    def _call(self, s: CData, ctx: CData, func_field: str, args: CData, n: int) -> bool:
        ffi, lib = self.ffi, self.lib
        trap = ffi.new("wasm_trap_t **")
        err = lib.wasmtime_func_call_unchecked(ctx, ffi.addressof(s, func_field), args, n, trap)
        if err != ffi.NULL or trap[0] != ffi.NULL:
            s.error, s.trap = err, trap[0]
            return False
        return True

    def _guest_alloc(self, s: CData, ctx: CData, align: int, n: int) -> int:
        a = self.ffi.new("wt_val_raw_t[4]")
        a[2].i32, a[3].i32 = align, n
        if not self._call(s, ctx, "f_realloc", a, 4):
            s.status = Status.TRAP
            return -1
        ptr = a[0].i32 & 0xFFFFFFFF
        if ptr + n > self.ctx_memory(s, ctx)[1] or ptr % align:
            s.status = Status.BAD_ALLOC
            s.detail[0], s.detail[1] = ptr, n
            return -1
        return ptr

    def ctx_alloc(self, s: CData, ctx: CData, align: int, n: int, name: str) -> int:
        ptr = self._guest_alloc(s, ctx, align, n)
        if ptr < 0:   # host.c's alloc_failure
            if s.status == Status.BAD_ALLOC:
                self.native.set_fault(s, f"host import `{name}`: cabi_realloc returned [{s.detail[0]}, "
                                         f"{s.detail[0] + s.detail[1]}): misaligned or outside linear memory")
                s.host_trap = self.ffi.NULL
            else:
                if s.error != self.ffi.NULL:
                    self.lib.wasmtime_error_delete(s.error)
                    s.error = self.ffi.NULL
                    self.native.set_fault(s, f"host import `{name}`: cabi_realloc failed")
                s.host_trap, s.trap = s.trap, self.ffi.NULL
        return ptr

    def _write_list(self, s: CData, src: CData, n: int) -> int:
        if n == 0:
            return 0
        ptr = self._guest_alloc(s, s.ctx, 4, n * 4)
        if ptr >= 0:
            self.ffi.memmove(self.ffi.cast("uint8_t *", self.memory(s)[0] + ptr), src, n * 4)
        return ptr

    def _post(self, s: CData, result_ptr: int) -> bool:
        """step.c's run_post: post-return on what is left of its call's time limit."""
        s.stage = Stage.POST
        a = self.ffi.new("wt_val_raw_t[1]")
        a[0].i32 = result_ptr - (1 << 32) if result_ptr >= 1 << 31 else result_ptr
        if self._call(s, s.ctx, "f_post", a, 1):
            return True
        s.status = Status.TRAP
        return False

    def check_mask(self, mem: int, size: int, ptr: int, words: int, vocab_size: int, row: int) -> tuple[int, int, int]:
        """step.c's aicirt_check_mask."""
        if words != (vocab_size + 31) // 32:
            return Status.BAD_MASK_LEN, words, ptr
        if ptr + words * 4 > size:
            return Status.BAD_MASK_RANGE, ptr, words
        self.ffi.memmove(self.ffi.cast("uint8_t *", row), self.ffi.cast("uint8_t *", mem + ptr), words * 4)
        # ffi.buffer has the buffer protocol; numpy's stubs accept only the builtin buffer types
        out = np.frombuffer(self.ffi.buffer(self.ffi.cast("uint8_t *", row), words * 4),  # type: ignore[call-overload]
                            dtype=np.uint32)
        tail = vocab_size % 32
        extra = int(out[-1]) >> tail if tail else 0
        if extra:
            return Status.BAD_MASK_BITS, (words - 1) * 32 + tail + (extra & -extra).bit_length() - 1, 0
        return (Status.OK if out.any() else Status.EMPTY_MASK), 0, 0

    def _lift(self, s: CData) -> None:
        base, size = self.memory(s)
        # ffi.buffer: see check_mask
        mem = np.frombuffer(self.ffi.buffer(self.ffi.cast("uint8_t *", base), size),  # type: ignore[call-overload]
                            dtype=np.uint8)
        rd = lambda off: int(mem[off:off + 4].view(np.uint32)[0])  # noqa: E731
        if s.result_ptr + abi.RESULT_SIZE > size:
            s.status = Status.BAD_RESULT
            return
        s.branches_ptr, s.n_branches = rd(s.result_ptr), rd(s.result_ptr + 4)
        if s.branches_ptr + s.n_branches * abi.BRANCH_SIZE > size:
            s.status = Status.BAD_RESULT
            return
        b = s.branches_ptr
        if s.n_branches != 1 or mem[b + abi.BRANCH_MASK_TAG] == 0 or rd(b + abi.BRANCH_SPLICES_LEN) != 0:
            s.status = Status.LIFT
            return
        s.temp_is_some = int(mem[b + abi.BRANCH_TEMP_TAG] != 0)
        s.temp = float(mem[b + abi.BRANCH_TEMP_VALUE:b + abi.BRANCH_TEMP_VALUE + 4].view(np.float32)[0])
        st, d0, d1 = self.check_mask(base, size, rd(b + abi.BRANCH_MASK_PTR), rd(b + abi.BRANCH_MASK_LEN),
                                     s.vocab_size, int(self.ffi.cast("uintptr_t", s.mask_row)))
        s.status, s.detail[0], s.detail[1] = st, d0, d1
        if st == Status.OK and s.has_post:
            self._post(s, s.result_ptr)

    def step(self, s: CData) -> None:
        """step.c's aicirt_step."""
        t0 = self._run(s)
        s.elapsed_us = (time.perf_counter() - t0) * 1e6
        s.cpu_us = (time.thread_time_ns() - s.cpu_start_ns) / 1e3
        if s.calls > 1:   # step.c: the caller-runs rule's history (first calls left out)
            s.hist_calls += 1
            s.hist_max_us = max(s.hist_max_us, s.cpu_us)
        s.done = 1

    def _run(self, s: CData) -> float:
        """The call, stopping at the first failure (step.c's `goto out`); returns when the call's
        own time began (after `_initialize`)."""
        t0 = time.perf_counter()
        s.started_us = t0 * 1e6
        s.cpu_us = 0
        s.turn_wait_us = s.turn_wait_since_us = 0
        self.clock_start(s, s.budget_us)   # before `started`: the engine thread reads the clock then
        s.started = 1
        s.error = s.trap = self.ffi.NULL
        s.n_branches = 0
        s.fault_len = 0
        if s.needs_init:
            s.needs_init = 0
            s.stage = Stage.INITIALIZE
            if not self._call(s, s.ctx, "f_init", self.ffi.new("wt_val_raw_t[1]"), 0):
                s.status = Status.TRAP
                return t0
            t0 = time.perf_counter()
            s.started_us = t0 * 1e6
            self.clock_start(s, s.budget_us)
        if s.post_pending:   # step.c: a lifted result's post-return, on the worker
            s.post_pending = 0
            self.clock_start(s, max(s.post_left_us, 0))
            if not self._post(s, s.post_ptr):
                return t0
            s.started_us = time.perf_counter() * 1e6
            self.clock_start(s, s.budget_us)
        s.stage = Stage.ARGUMENTS
        tokens = self._write_list(s, s.tokens, s.n_tokens)
        group = -1 if tokens < 0 else self._write_list(s, s.group, s.n_group)
        n_group, s.n_group = s.n_group, 0   # a fork group is reported on one call only
        if group >= 0:
            a = self.ffi.new("wt_val_raw_t[7]")
            for i, v in enumerate((s.backtrack, tokens, s.n_tokens, s.sampled_is_some, s.sampled, group, n_group)):
                a[i].i32 = v - (1 << 32) if v >= 1 << 31 else v
            s.stage = Stage.MID_PROCESS
            if self._call(s, s.ctx, "f_mid", a, 7):
                s.result_ptr = a[0].i32 & 0xFFFFFFFF
                self._lift(s)
            else:
                s.status = Status.TRAP
        return t0

    def make_pool(self, workers: int, max_workers: int, stall_s: float, steal: bool,
                  engine: wasmtime.Engine, tick_s: float) -> "ThreadPool":
        return ThreadPool(self, workers, max_workers, stall_s, steal, engine, tick_s)

    # -- host state ------------------------------------------------------------------------------
    def log_append(self, s: CData, data: bytes) -> None:
        """host.c's aicirt_log_append (the buffer is kept alive by `_logs`)."""
        n, cap = len(data), s.log_cap
        if not n or not cap:
            return
        if s.log == self.ffi.NULL:
            buf = self.ffi.new("uint8_t[]", cap)
            _logs[int(self.ffi.cast("uintptr_t", s))] = buf
            s.log = buf
        if n >= cap:
            self.ffi.memmove(s.log, data[n - cap:], cap)
            s.log_len = cap
        else:
            if s.log_len + n > cap:
                drop = s.log_len + n - cap
                self.ffi.memmove(s.log, s.log + drop, s.log_len - drop)
                s.log_len -= drop
            self.ffi.memmove(s.log + s.log_len, data, n)
            s.log_len += n
        s.call_log_len = min(s.call_log_len + n, s.log_len)

    # -- instances: spawn.c's aicirt_spawn / _fork_copy / _store_delete ----------------------------
    def _fault(self, s: CData, text: str) -> int:
        self.native.set_fault(s, text)
        return 1

    def _export(self, inst: CData, report: CData, name: bytes, kind: int, field_ptr: CData, n: int) -> int:
        """spawn.c's export_copy: 0, or 1 with a fault in `report`."""
        item: CData = self.ffi.new("wt_extern_t *")   # held by this frame while its handle is copied out
        if not self.lib.wasmtime_instance_export_get(inst.ctx, self.ffi.addressof(inst, "inst"), name, len(name), item):
            return self._fault(report, f"export '{name.decode()}' is missing")
        if item.kind != kind:
            return self._fault(report, f"export '{name.decode()}' is of another kind")
        self.ffi.memmove(field_ptr, item.of, n)
        return 0

    def spawn(self, plan: "SpawnPlan", s: CData) -> int:
        ffi, lib = self.ffi, self.lib
        store = lib.wasmtime_store_new(ffi.cast("void *", plan.engine_addr), ffi.NULL, ffi.NULL)
        s.store = store
        if store == ffi.NULL:
            return self._fault(s, "no Store could be made")
        lib.wasmtime_store_limiter(store, plan.memory_bytes, -1, -1, -1, -1)
        s.ctx = lib.wasmtime_store_context(store)
        lib.wasmtime_context_set_data(s.ctx, s)
        lib.wasmtime_store_epoch_deadline_callback(store, ffi.cast("wt_epoch_cb", self.epoch_callback), s, ffi.NULL)
        s.budget_us = s.first_call_ticks * s.tick_us
        self.clock_start(s, s.budget_us)
        trap = ffi.new("wasm_trap_t **")
        err = lib.wasmtime_instance_pre_instantiate(ffi.cast("void *", plan.pre_addr), s.ctx, ffi.addressof(s, "inst"), trap)
        if err != ffi.NULL or trap[0] != ffi.NULL:
            s.error, s.trap = err, trap[0]
            return 1
        for field, name, kind, n in (("f_realloc", plan.names[0], _EXTERN_FUNC, 16), ("f_mid", plan.names[1], _EXTERN_FUNC, 16),
                                     ("f_post", plan.names[2], _EXTERN_FUNC, 16), ("f_init", plan.names[3], _EXTERN_FUNC, 16),
                                     ("mem", plan.names[4], _EXTERN_MEMORY, 24)):   # wt_func_t, wt_memory_t (step.c)
            if name is not None and self._export(s, s, name, kind, ffi.addressof(s, field), n):
                return 1
        s.has_post, s.needs_init = plan.has_post, plan.has_init
        return 0

    def store_delete(self, s: CData) -> None:
        store = s.store
        s.store = s.ctx = self.ffi.NULL
        if store != self.ffi.NULL:
            self.lib.wasmtime_store_delete(store)

    def fork_copy(self, plan: "SpawnPlan", src: CData, dst: CData) -> int:
        ffi, lib = self.ffi, self.lib
        src_base, src_size = self.memory(src)
        dst_base, dst_size = self.memory(dst)
        if src_size > dst_size:
            prev = ffi.new("uint64_t *")
            err = lib.wasmtime_memory_grow(dst.ctx, ffi.addressof(dst, "mem"), (src_size - dst_size) // 65536, prev)
            if err != ffi.NULL:
                dst.error = err
                return -1
            dst_base, dst_size = self.memory(dst)
        assert plan.image is not None
        written = pages.copy_changed(self.native, dst_base, src_base, src_size, plan.image,
                                       src.resident_bytes, dst.resident_bytes)
        gs, gd, val = ffi.new("uint64_t[3]"), ffi.new("uint64_t[3]"), ffi.new("uint64_t[8]")
        for _, name in plan.globals:
            if self._export(src, dst, name, _EXTERN_GLOBAL, gs, 24) or self._export(dst, dst, name, _EXTERN_GLOBAL, gd, 24):
                return -1
            lib.wasmtime_global_get(src.ctx, gs, val)
            err = lib.wasmtime_global_set(dst.ctx, gd, val)
            if err != ffi.NULL:
                dst.error = err
                return -1
        self.copy_seen(src, dst)
        dst.post_pending, dst.post_ptr, dst.post_left_us = src.post_pending, src.post_ptr, src.post_left_us
        dst.needs_init, dst.calls = src.needs_init, src.calls
        dst.hist_calls, dst.hist_max_us, dst.steal_barred = src.hist_calls, src.hist_max_us, src.steal_barred
        arg = bytes(ffi.buffer(src.arg, src.arg_len)) if src.arg_len else b""
        src.wasi_rng, dst.wasi_rng = wasi_rng.split(src.wasi_rng or wasi_rng.seed(arg))
        return written

    def release(self, s: CData) -> None:
        self.store_delete(s)
        addr = int(self.ffi.cast("uintptr_t", s))
        _logs.pop(addr, None)
        _seen.pop(addr, None)
        s.log = s.seen = self.ffi.NULL
        s.log_len = s.call_log_len = s.n_seen = s.seen_cap = 0

    # -- the rows API: step.c's aicirt_rows_start / _collect / seen -------------------------------
    def _seen_reserve(self, s: CData, n: int) -> bool:
        if n <= s.seen_cap:
            return True
        cap = s.seen_cap or 64
        while cap < n:
            cap *= 2
        buf = self.ffi.new("uint32_t[]", cap)
        if s.n_seen:
            self.ffi.memmove(buf, s.seen, s.n_seen * 4)
        _seen[int(self.ffi.cast("uintptr_t", s))] = buf
        s.seen, s.seen_cap = buf, cap
        return True

    def seen_tokens(self, s: CData) -> list[int]:
        return cast("list[int]", self.ffi.unpack(s.seen, s.n_seen)) if s.n_seen else []

    def copy_seen(self, src: CData, dst: CData) -> None:
        self._seen_reserve(dst, src.n_seen)
        if src.n_seen:
            self.ffi.memmove(dst.seen, src.seen, src.n_seen * 4)
        dst.n_seen = src.n_seen

    def start_rows(self, slots: list, sampled: np.ndarray, edits: "EditArrays | None", mask_base: int, words: int,
                   stamp: int, row_status: np.ndarray) -> tuple[list, int, int]:
        """step.c's aicirt_rows_start, less the queueing: (slots to run, rc, misuse)."""
        for i, s in enumerate(slots):
            if s.stamp == stamp:
                return [], -(i + 1), 1
            if s.call_out == 1:
                return [], -(i + 1), 2
            if s.stopped == 2:
                return [], -(i + 1), 3
            s.stamp = stamp
        run = []
        for i, s in enumerate(slots):
            if s.stopped:
                row_status[i] = RowStatus.STOPPED
                continue
            if s.call_out:
                row_status[i] = RowStatus.LATE
                continue
            smp = int(sampled[i])
            if smp >= s.vocab_size:
                s.detail[0] = smp
                row_status[i] = RowStatus.BAD_TOKEN
                continue
            seen = self.seen_tokens(s)
            e = int(edits.of_row[i]) if edits is not None else -1
            if edits is not None and e >= 0:
                u = int(edits.unchanged[e])
                if u > s.n_seen:
                    row_status[i] = RowStatus.BAD_EDIT
                    continue
                tok = seen[:u] + edits.tokens[edits.offsets[e]:edits.offsets[e + 1]].tolist()
                limit = min(len(tok), s.n_seen)
                cp = u
                while cp < limit and seen[cp] == tok[cp]:
                    cp += 1
                new = tok[cp:]
            else:
                cp, new = s.n_seen, [smp] if smp >= 0 else []
            self._seen_reserve(s, cp + len(new))
            s.backtrack = s.n_seen - cp
            if new:
                s.seen[cp:cp + len(new)] = new
            s.n_seen = cp + len(new)
            s.tokens = s.seen + cp
            s.n_tokens = len(new)
            s.sampled_is_some = int(smp >= 0)
            s.sampled = max(smp, 0)
            s.mask_row = self.ffi.cast("uint32_t *", mask_base + i * words * 4)
            s.budget_us = s.call_budget_us if s.calls else s.first_budget_us
            s.done = 0
            s.calls += 1
            s.call_out = 1
            row_status[i] = RowStatus.STARTED
            run.append(s)
        return run, 0, 0

    def slots(self, ptrs: np.ndarray) -> list:
        """The slots at the addresses `ptrs` (uint64)."""
        return [self.ffi.cast("aicirt_slot *", int(p)) for p in ptrs]

    def collect_rows(self, ptrs: np.ndarray, row_status: np.ndarray, kind: np.ndarray, temperature: np.ndarray,
                     elapsed_us: np.ndarray) -> int:
        for i, s in enumerate(self.slots(ptrs)):
            elapsed_us[i], temperature[i] = 0.0, math.nan
            if row_status[i] != RowStatus.STARTED:
                kind[i] = RowKind.OTHER
            elif not s.done:
                kind[i] = RowKind.PENDING
            else:
                elapsed_us[i] = s.elapsed_us
                temp_ok = not s.temp_is_some or (math.isfinite(s.temp) and s.temp >= 0)
                if s.status == Status.OK and not s.stopped and not s.call_log_len and temp_ok:
                    kind[i] = RowKind.MASK
                    temperature[i] = s.temp if s.temp_is_some else math.nan
                    s.call_out = 0
                else:
                    kind[i] = RowKind.OTHER
        return int((kind != RowKind.MASK).sum())

    @staticmethod
    def gather_rows(table: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, int]:
        """step.c's aicirt_rows_gather."""
        bad = (index < 0) | (index >= len(table))
        ptrs = table[np.where(bad, 0, index)]
        bad |= ptrs == 0
        return ptrs, int(np.argmax(bad)) if bad.any() else -1

    def host_callback(self, index: int, native_ok: bool) -> tuple[int, bool]:
        """Every import is the Python trampoline here (it takes a handler id as env)."""
        return int(self.ffi.cast("uintptr_t", self._trampoline)), True

    def wasi_callback(self, name: str) -> int:
        """No native WASI here: every function is the Python shim (runtime/wasi.py)."""
        return 0

    def new_vars(self, limit: int) -> "PyVars":
        return PyVars(limit)


_logs: dict[int, object] = {}   # slot address -> its log buffer (the fallback's malloc)
_seen: dict[int, object] = {}   # slot address -> the buffer of tokens its controller saw


def chunk(n: int) -> int:
    """host.c's chunk(): the bytes glibc's malloc takes for an n-byte block (0 for none)."""
    if not n:
        return 0
    if n >= 128 << 10:
        return (n + 16 + 4095) & ~4095
    return max(32, (n + 8 + 15) & ~15)


# host.c's ENT_COST: sizeof(var_entry) (two pointers, seven uint32, padded to 48) and its uint32 in `order`
ENT_COST = 48 + 4


class _Var:
    __slots__ = ("value", "cap", "pending", "pending_len", "writer")

    def __init__(self) -> None:
        self.value = bytearray()
        self.cap = self.pending_len = self.writer = 0
        self.pending: str | None = None   # None, "append" or "set": the change not yet taken


class PyVars:
    """host.c's aicirt_vars in Python: the same accounting (held counts what host.c would
    allocate, to the byte), the same coalescing of changes, the same messages."""

    ptr = None   # no native state: the slot's `vars` stays NULL

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.values: dict[str, _Var] = {}
        self.order: dict[str, None] = {}   # changed since the last take, first change first
        self.held = 0
        self.ents_cap = self.slots_cap = 0
        self.lock = threading.Lock()

    def _tables(self, ents_cap: int, slots_cap: int) -> int:
        return ents_cap * ENT_COST + slots_cap * 4

    def get(self, name: str) -> bytes | None:
        with self.lock:
            e = self.values.get(name)
            return bytes(e.value) if e is not None else None

    def set(self, seq_id: int, name: str, value: bytes, append: bool) -> None:
        """host.c's aicirt_vars_set. Raises ValueError over Limits.variable_bytes."""
        with self.lock:
            e = self.values.get(name)
            held, vlen = self.held, len(value)
            new_len = (len(e.value) if append and e is not None else 0) + vlen
            ents_cap, slots_cap = self.ents_cap, self.slots_cap
            if e is None:
                n = len(self.values)
                if n == ents_cap:
                    ents_cap = ents_cap * 2 if ents_cap else 16
                if (n + 1) * 4 > slots_cap * 3:
                    slots_cap = slots_cap * 2 if slots_cap else 16
                held += (self._tables(ents_cap, slots_cap) - self._tables(self.ents_cap, self.slots_cap)
                         + chunk(len(name.encode("utf-8"))))
            else:
                held -= chunk(e.cap)
            cap = new_len
            if append and e is not None and new_len > e.cap:
                want = e.cap * 2
                room = self.limit - held if self.limit > held + chunk(new_len) else 0
                if want > new_len and chunk(want) <= room:
                    cap = want
            elif e is not None and new_len <= e.cap and (append or new_len * 2 > e.cap):
                cap = e.cap
            held += chunk(cap)
            if held > self.limit:
                raise ValueError(f"variables would take {held} bytes, over the limit of {self.limit} "
                                 f"(Limits.variable_bytes)")
            if e is None:
                e = self.values[name] = _Var()
                self.ents_cap, self.slots_cap = ents_cap, slots_cap
            e.cap = cap
            if append:
                e.value += value
            else:
                e.value = bytearray(value)
            if e.pending is None:
                self.order[name] = None
                e.pending_len = 0
            if not append:
                e.pending = "set"
            elif e.pending != "set":
                e.pending, e.pending_len = "append", e.pending_len + vlen
            e.writer = seq_id
            self.held = held

    def take_changes(self) -> list[tuple[int, str, str, bytes]]:
        """host.c's aicirt_vars_take: one record per variable changed since the last take."""
        with self.lock:
            out = []
            for name in self.order:
                e = self.values[name]
                tail = bytes(e.value[len(e.value) - e.pending_len:]) if e.pending == "append" else bytes(e.value)
                out.append((e.writer, "append" if e.pending == "append" else "set", name, tail))
                e.pending = None
            self.order = {}
            return out

    def snapshot(self) -> dict[str, bytes]:
        with self.lock:
            return {name: bytes(e.value) for name, e in self.values.items()}

    def close(self) -> None:
        pass


_worker = threading.local()   # `pool` on a ThreadPool's worker threads (step.c's tl_worker)
STALL_SLICE_S = 0.01            # step.c's STALL_SLICE_US
STEAL_HEADROOM = 10.0           # step.c's: a call is taken if its history x this fits before the deadline
STEAL_PAUSE = 100.0             # step.c's: an overrun pauses taking calls for this many times itself
DEFER_GAP_S = 20e-6             # step.c's DEFER_GAP_US: a submit wakes no worker the caller would beat
DEFER_WORK_US = 20.0            # step.c's


def _predicted_short(s: CData, left_us: float) -> bool:
    """step.c's predicted_short: the caller-runs rule, but for the claim."""
    return not (s.steal_barred or s.needs_init or s.calls <= 1 or not s.hist_calls
                or s.hist_max_us * STEAL_HEADROOM > left_us)


class ThreadPool:
    """step.c's worker pool over Python threads: FIFO queue, `done` flags, and the same rule for
    stalls (a worker whose call runs past `stall_s` is replaced, up to `max_workers` threads in
    all, and leaves after the call; stalled calls take turns, at most `run_stalled_max` at once;
    with `steal`, the caller-runs rule at wait). Its epoch clock is a Python thread (EpochClock),
    kicked at each submit, ticking `engine` every `tick_s` while calls are out."""

    def __init__(self, impl: Fallback, workers: int, max_workers: int, stall_s: float, steal: bool,
                 engine: wasmtime.Engine, tick_s: float) -> None:
        self.impl = impl
        self.steal = steal
        self.steal_paused_until = 0.0   # perf_counter() seconds
        self.steals = 0                 # calls run on a waiting caller
        self.caller_busy = 0            # calls running on waiting callers now
        self.base, self.max, self.stall_s = workers, max(max_workers, workers), stall_s
        self.cv = threading.Condition()
        self.queue: deque = deque()
        self.busy_since: dict[threading.Thread, float] = {}   # 0.0 when idle
        self.stalled: set[threading.Thread] = set()
        self.stalls_total = 0
        cores = os.cpu_count() or 1
        self.run_stalled_max = cores // 2 if cores >= 4 else 1
        self.turns: dict[threading.Thread, float] = {}         # holding a turn: since when
        self.waiting_turn: deque[threading.Thread] = deque()
        self.stop = False
        self.all: list[threading.Thread] = []
        with self.cv:
            for _ in range(workers):
                self._spawn()
        self.submit_end = self.last_gap_s = 0.0   # step.c's submit_end_us / last_gap_us (perf_counter seconds)
        self.clock = EpochClock(engine, lambda: self.pending, tick_s, self._nudge)

    def ticking(self) -> "contextlib.AbstractContextManager[None]":
        """CPool.ticking: the clock ticks while the block runs guest code outside the pool."""
        return self.clock.ticking()

    def _spawn(self) -> None:
        t = threading.Thread(target=self._work, daemon=True, name="aicirt-worker")
        self.busy_since[t] = 0.0
        self.all = [w for w in self.all if w.is_alive()] + [t]
        t.start()

    def _replace_stalled(self) -> None:
        """Keep `base` workers free of stalled calls (under self.cv)."""
        while not self.stop and len(self.busy_since) - len(self.stalled) < self.base \
                and len(self.busy_since) < self.max:
            self._spawn()

    def _grant_turns(self) -> None:
        """step.c's grant_turns (under self.cv)."""
        granted = False
        while self.waiting_turn and len(self.turns) < self.run_stalled_max:
            self.turns[self.waiting_turn.popleft()] = time.perf_counter()
            granted = True
        if granted:
            self.cv.notify_all()

    def _release_turn(self, me: threading.Thread) -> None:
        if self.turns.pop(me, None) is not None:
            self._grant_turns()

    def _take_turn(self, me: threading.Thread, s: CData) -> float:
        """step.c's take_turn (under self.cv): seconds spent waiting."""
        t0 = time.perf_counter()
        s.turn_wait_since_us = t0 * 1e6
        self.waiting_turn.append(me)
        self._grant_turns()
        while me not in self.turns and not self.stop:
            self.cv.wait()
        if me not in self.turns and me in self.waiting_turn:
            self.waiting_turn.remove(me)
        waited = time.perf_counter() - t0
        s.turn_wait_us += waited * 1e6
        s.turn_wait_since_us = 0
        return waited

    def stalled_turn(self, s: CData, now: float, cpu_s: float) -> float:
        """step.c's stalled_turn, from the epoch callback on the worker running the call (whose
        call has used `cpu_s` of CPU: a stall is counted in CPU time): seconds waited for a turn."""
        me = threading.current_thread()
        if me not in self.stalled and cpu_s < self.stall_s:
            return 0.0
        with self.cv:
            if self.stop:
                return 0.0
            if me not in self.stalled:
                self.stalled.add(me)
                self.stalls_total += 1
            if me not in self.turns:
                return self._take_turn(me, s)
            if self.waiting_turn and now - self.turns[me] >= STALL_SLICE_S:
                self._release_turn(me)
                return self._take_turn(me, s)
            return 0.0

    def _work(self) -> None:
        me = threading.current_thread()
        _worker.pool = self
        with self.cv:
            while True:
                while not self.queue and not self.stop:
                    self.cv.wait()
                if not self.queue:
                    break
                s = self.queue.popleft()
                if s.claimed:   # a waiting caller ran it
                    continue
                s.claimed = 1
                self.busy_since[me] = time.perf_counter()
                self.cv.release()
                try:
                    self.impl.step(s)
                finally:
                    self.cv.acquire()
                self.busy_since[me] = 0.0
                self.cv.notify_all()
                self._release_turn(me)
                if me in self.stalled:   # leave; the worker that replaced it stays
                    break
            self.stalled.discard(me)
            del self.busy_since[me]

    def submit_rows(self, table: np.ndarray, index: np.ndarray, sampled: np.ndarray, edits: "EditArrays | None",
                    masks: np.ndarray, words: int, stamp: int, scratch: "RowScratch") -> tuple[int, None]:
        """CPool.submit_rows (step.c's aicirt_rows_submit)."""
        ptrs, bad = self.impl.gather_rows(table, index)
        if bad >= 0:
            scratch.row_status[bad] = 5
            return -(bad + 1), None
        scratch.slots[:] = ptrs
        rc, misuse = self.start_rows(ptrs, sampled, edits, masks, words, stamp, scratch.row_status)
        if rc < 0:
            scratch.row_status[-rc - 1] = misuse
        return rc, None

    def finish_rows(self, scratch: "RowScratch", held: None, timeout_s: float, closed: bool) -> int:
        """CPool.finish_rows (step.c's aicirt_rows_finish)."""
        t0 = time.perf_counter()
        if scratch.n and not closed:
            self.wait_rows(scratch.slots, scratch.row_status, timeout_s)
        scratch.blocked_us[0] = (time.perf_counter() - t0) * 1e6
        if not scratch.n:
            return 0
        return self.impl.collect_rows(scratch.slots, scratch.row_status, scratch.kind, scratch.temperature,
                                      scratch.elapsed_us)

    def start_rows(self, ptrs: np.ndarray, sampled: np.ndarray, edits: "EditArrays | None", masks: np.ndarray,
                   words: int, stamp: int, row_status: np.ndarray) -> tuple[int, int]:
        run, rc, misuse = self.impl.start_rows(self.impl.slots(ptrs), sampled, edits, masks.ctypes.data, words, stamp,
                                               row_status)
        if run:   # step.c's rows_start: no wake-up when the caller is predicted to run them (see step.c)
            left_us = 2 * self.stall_s * 1e6
            defer = all(_predicted_short(s, left_us) for s in run) and (
                len(run) == 1 or sum(s.hist_max_us for s in run) <= DEFER_WORK_US)
            self.submit(run, defer)
        return rc, misuse

    def submit(self, slots: list, defer: bool = False) -> None:
        with self.cv:
            for s in slots:
                s.started = s.claimed = 0
                self.queue.append(s)
            self._replace_stalled()
            now = self.submit_end = time.perf_counter()
            if not (defer and self.steal and self.last_gap_s < DEFER_GAP_S and now >= self.steal_paused_until):
                self.cv.notify_all()
        self.clock.kick()

    def _nudge(self) -> None:
        """From the epoch clock, each tick: calls still queued get a worker (step.c's ticker)."""
        with self.cv:
            if self.queue:
                self.cv.notify_all()

    def wait_rows(self, ptrs: np.ndarray, row_status: np.ndarray, timeout_s: float) -> int:
        out = (row_status == RowStatus.STARTED) | (row_status == RowStatus.LATE)
        slots = self.impl.slots(ptrs[out])
        now = time.perf_counter()
        deadline = now + timeout_s
        with self.cv:
            self.last_gap_s = now - self.submit_end
        if self.steal:
            self._run_queued_here(slots, deadline)
        if any(not s.claimed for s in slots):   # step.c's wake_for_queued
            with self.cv:
                self.cv.notify_all()
        while True:
            left = sum(1 for s in slots if not s.done)
            now = time.perf_counter()
            if not left or now >= deadline:
                return left
            with self.cv:
                self._replace_stalled()
            time.sleep(0.0002)

    def _run_queued_here(self, slots: list, deadline: float) -> None:
        """step.c's run_queued_here: the caller-runs rule, last row first."""
        for s in reversed(slots):
            now = time.perf_counter()
            if s.claimed or s.done or s.steal_barred or s.needs_init or s.calls <= 1 or not s.hist_calls \
                    or s.hist_max_us * STEAL_HEADROOM > (deadline - now) * 1e6:
                continue
            with self.cv:
                mine = not s.claimed and not self.stop and now >= self.steal_paused_until
                if mine:
                    s.claimed = 1
                    self.caller_busy += 1
                    q = self.queue   # taken entries at either end go (step.c: no worker may be woken to pop them)
                    while q and q[-1].claimed:
                        q.pop()
                    while q and q[0].claimed:
                        q.popleft()
            if not mine:
                continue
            try:
                self.impl.step(s)
            finally:
                end = time.perf_counter()
                with self.cv:
                    self.caller_busy -= 1
                    self.steals += 1
                    if end > deadline:   # it outlasted the deadline: bar it, pause taking calls
                        s.steal_barred = 1
                        self.steal_paused_until = max(self.steal_paused_until, end + STEAL_PAUSE * (end - deadline))
                    self.cv.notify_all()

    @property
    def pending(self) -> int:
        """Calls running or queued."""
        with self.cv:
            return len(self.queue) + self.caller_busy + sum(1 for since in self.busy_since.values() if since)

    @property
    def threads(self) -> int:
        with self.cv:
            return len(self.busy_since)

    def stats(self) -> PoolStats:
        """CPool.stats."""
        with self.cv:
            stalled = len(self.stalled)
            return PoolStats(len(self.busy_since), stalled, len(self.turns),
                             sum(1 for v in self.busy_since.values() if v), len(self.queue),
                             stalled > 0 and stalled >= self.max - self.base, self.stalls_total)

    def close(self) -> None:
        """Stop the workers (waits for running calls, the clock ticking), then the clock."""
        self.clock.drain()
        with self.cv:
            self.stop = True
            self.cv.notify_all()   # wakes calls waiting for a turn too
        for t in list(self.all):
            t.join()
        with self.cv:   # a call a waiting caller runs must end before the Stores go (step.c: callers)
            while self.caller_busy:
                self.cv.wait()
        self.clock.close()
