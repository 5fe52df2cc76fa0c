"""step.c's and host.c's logic in Python over cffi's ABI mode, for machines that cannot compile them.

Same slot struct, same statuses, same results, same messages; keep it in step with the C line
for line. Every host import is a Python callback here (with the GIL), variables live in Python.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, cast

import numpy as np

from .. import abi
from ..abi import RowKind, RowStatus, Stage, Status
from .types import CData

if TYPE_CHECKING:
    from . import EditArrays, Native

# Each variable and each change record counts this much beside its name and value (host.c's VAR_OVERHEAD).
VAR_OVERHEAD = 32


class Fallback:
    mode = "python"

    def __init__(self, native: "Native") -> None:
        self.native = native
        self.ffi, self.lib = native.wt, native.wtlib

        @self.ffi.callback("wasm_trap_t *(void *, void *, wt_val_raw_t *, size_t)")
        def trampoline(env: CData, caller: CData, args: CData, n: int) -> CData:
            ctx = self.lib.wasmtime_caller_context(caller)
            slot: CData = self.ffi.cast("aicirt_slot *", self.lib.wasmtime_context_get_data(ctx))
            if not native.dispatch(int(self.ffi.cast("intptr_t", env)), slot, ctx, args):
                return self.ffi.NULL
            trap, slot.host_trap = slot.host_trap, self.ffi.NULL
            return self.ffi.cast("wasm_trap_t *", trap) if trap != self.ffi.NULL else \
                self.lib.wasmtime_trap_new(slot.fault, slot.fault_len)

        # a cdata at run time (types-cffi says the decorated function); kept alive as long as this object
        self._trampoline: CData = trampoline

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

    def _post(self, s: CData, result_ptr: int, left_us: float) -> bool:
        """step.c's run_post: post-return on what is left of its call's time limit."""
        self.lib.wasmtime_context_set_epoch_deadline(s.ctx, int(left_us / s.tick_us) + 1 if left_us > 0 else 1)
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
            self._post(s, s.result_ptr, s.budget_us - (time.perf_counter() * 1e6 - s.started_us))

    def step(self, s: CData) -> None:
        """step.c's aicirt_step."""
        t0 = self._run(s)
        s.elapsed_us = (time.perf_counter() - t0) * 1e6
        s.done = 1

    def _run(self, s: CData) -> float:
        """The call, stopping at the first failure (step.c's `goto out`); returns when the call's
        own time began (after `_initialize`)."""
        t0 = time.perf_counter()
        s.started_us = t0 * 1e6
        s.started = 1
        s.error = s.trap = self.ffi.NULL
        s.n_branches = 0
        s.fault_len = 0
        if s.needs_init:
            s.needs_init = 0
            s.stage = Stage.INITIALIZE
            self.lib.wasmtime_context_set_epoch_deadline(s.ctx, s.deadline_ticks)
            if not self._call(s, s.ctx, "f_init", self.ffi.new("wt_val_raw_t[1]"), 0):
                s.status = Status.TRAP
                return t0
            t0 = time.perf_counter()
            s.started_us = t0 * 1e6
        if s.post_pending:   # step.c: a lifted result's post-return, on the worker
            s.post_pending = 0
            if not self._post(s, s.post_ptr, s.post_left_us):
                return t0
            s.started_us = time.perf_counter() * 1e6
        self.lib.wasmtime_context_set_epoch_deadline(s.ctx, s.deadline_ticks)
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

    def make_pool(self, workers: int, max_workers: int, stall_s: float) -> "ThreadPool":
        return ThreadPool(self, workers, max_workers, stall_s)

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

    def release(self, s: CData) -> None:
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
            s.deadline_ticks = s.call_ticks if s.calls else s.first_call_ticks
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
                     elapsed_us: np.ndarray) -> None:
        for i, s in enumerate(self.slots(ptrs)):
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

    def host_callback(self, index: int, native_ok: bool) -> tuple[int, bool]:
        """Every import is the Python trampoline here (it takes a handler id as env)."""
        return int(self.ffi.cast("uintptr_t", self._trampoline)), True

    def new_vars(self, limit: int) -> "PyVars":
        return PyVars(limit)


_logs: dict[int, object] = {}   # slot address -> its log buffer (the fallback's malloc)
_seen: dict[int, object] = {}   # slot address -> the buffer of tokens its controller saw


class PyVars:
    """host.c's aicirt_vars in Python: same accounting, same messages."""

    ptr = None   # no native state: the slot's `vars` stays NULL

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.values: dict[str, bytes] = {}
        self.changes: list[tuple[int, str, str, bytes]] = []
        self.held = self.pending = 0
        self.lock = threading.Lock()

    def get(self, name: str) -> bytes | None:
        with self.lock:
            return self.values.get(name)

    def set(self, seq_id: int, name: str, value: bytes, append: bool) -> None:
        n = len(name.encode("utf-8"))
        with self.lock:
            old = self.values.get(name)
            new = (old or b"") + value if append else value
            held = self.held - (VAR_OVERHEAD + n + len(old) if old is not None else 0) + VAR_OVERHEAD + n + len(new)
            pending = self.pending + VAR_OVERHEAD + n + len(value)
            if held > self.limit or pending > self.limit:
                raise ValueError(f"variables would take {max(held, pending)} bytes, over the limit of {self.limit} "
                                 f"(Limits.variable_bytes)")
            self.values[name] = new
            self.held, self.pending = held, pending
            self.changes.append((seq_id, "append" if append else "set", name, value))

    def take_changes(self) -> list[tuple[int, str, str, bytes]]:
        with self.lock:
            out, self.changes, self.pending = self.changes, [], 0
            return out

    def snapshot(self) -> dict[str, bytes]:
        with self.lock:
            return dict(self.values)

    def close(self) -> None:
        pass


class ThreadPool:
    """step.c's worker pool over Python threads: FIFO queue, `done` flags, and the same growth
    rule (another worker when every worker is stalled past `stall_s` and calls are queued)."""

    def __init__(self, impl: Fallback, workers: int, max_workers: int, stall_s: float) -> None:
        self.impl = impl
        self.base, self.max, self.stall_s = workers, max(max_workers, workers), stall_s
        self.cv = threading.Condition()
        self.queue: deque = deque()
        self.busy_since: dict[threading.Thread, float] = {}   # 0.0 when idle
        self.stop = False
        self.all: list[threading.Thread] = []
        with self.cv:
            for _ in range(workers):
                self._spawn()

    def _spawn(self) -> None:
        t = threading.Thread(target=self._work, daemon=True, name="aicirt-worker")
        self.busy_since[t] = 0.0
        self.all.append(t)
        t.start()

    def _grow_if_stalled(self) -> None:
        if not self.queue or len(self.busy_since) >= self.max:
            return
        now = time.perf_counter()
        if all(since and now - since >= self.stall_s for since in self.busy_since.values()):
            self._spawn()

    def _work(self) -> None:
        me = threading.current_thread()
        with self.cv:
            while True:
                while not self.queue and not self.stop:
                    if len(self.busy_since) > self.base:
                        break
                    self.cv.wait()
                if not self.queue:
                    break
                s = self.queue.popleft()
                self.busy_since[me] = time.perf_counter()
                self.cv.release()
                try:
                    self.impl.step(s)
                finally:
                    self.cv.acquire()
                self.busy_since[me] = 0.0
                self.cv.notify_all()
            del self.busy_since[me]

    def start_rows(self, ptrs: np.ndarray, sampled: np.ndarray, edits: "EditArrays | None", mask_base: int,
                   words: int, stamp: int, row_status: np.ndarray) -> tuple[int, int]:
        run, rc, misuse = self.impl.start_rows(self.impl.slots(ptrs), sampled, edits, mask_base, words, stamp, row_status)
        if run:
            self.submit(run)
        return rc, misuse

    def submit(self, slots: list) -> None:
        with self.cv:
            for s in slots:
                s.started = 0
                self.queue.append(s)
            self._grow_if_stalled()
            self.cv.notify_all()

    def wait(self, ptrs: np.ndarray, timeout_s: float) -> int:
        slots = self.impl.slots(ptrs)
        deadline = time.perf_counter() + timeout_s
        while True:
            left = sum(1 for s in slots if not s.done)
            now = time.perf_counter()
            if not left or now >= deadline:
                return left
            with self.cv:
                self._grow_if_stalled()
            time.sleep(0.0002)

    @property
    def pending(self) -> int:
        """Calls running or queued."""
        with self.cv:
            return len(self.queue) + sum(1 for since in self.busy_since.values() if since)

    @property
    def threads(self) -> int:
        with self.cv:
            return len(self.busy_since)

    def close(self) -> None:
        with self.cv:
            self.stop = True
            self.cv.notify_all()
        for t in list(self.all):
            t.join()
