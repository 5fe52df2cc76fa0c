"""step.c's logic in Python over cffi's ABI mode, for machines that cannot compile step.c.

Same slot struct, same statuses, same results; keep it in step with step.c line for line.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import (
    STATUS_BAD_ALLOC,
    STATUS_BAD_MASK,
    STATUS_BAD_RESULT,
    STATUS_EMPTY_MASK,
    STATUS_LIFT,
    STATUS_OK,
    STATUS_TRAP,
)


class Fallback:
    def __init__(self, ffi, lib) -> None:
        self.ffi, self.lib = ffi, lib
        self._args = None

    def memory(self, s):
        return self.lib.wasmtime_memory_data(s.ctx, self.ffi.addressof(s, "mem")), \
            self.lib.wasmtime_memory_data_size(s.ctx, self.ffi.addressof(s, "mem"))

    def _call(self, s, func_field: str, args, n: int) -> bool:
        ffi, lib = self.ffi, self.lib
        trap = ffi.new("wasm_trap_t **")
        err = lib.wasmtime_func_call_unchecked(s.ctx, ffi.addressof(s, func_field), args, n, trap)
        if err != ffi.NULL or trap[0] != ffi.NULL:
            s.error, s.trap = err, trap[0]
            return False
        return True

    def _write_list(self, s, src, n: int) -> int:
        if n == 0:
            return 0
        a = self.ffi.new("wt_val_raw_t[4]")
        a[2].i32, a[3].i32 = 4, n * 4
        if not self._call(s, "f_realloc", a, 4):
            s.status = STATUS_TRAP
            return -1
        ptr = a[0].i32 & 0xFFFFFFFF
        data, size = self.memory(s)
        if ptr + n * 4 > size:
            s.status = STATUS_BAD_ALLOC
            return -1
        self.ffi.memmove(data + ptr, src, n * 4)
        return ptr

    def post(self, s) -> None:
        if not s.has_post:
            return
        self.lib.wasmtime_context_set_epoch_deadline(s.ctx, s.deadline_ticks)
        a = self.ffi.new("wt_val_raw_t[1]")
        a[0].i32 = s.result_ptr
        if not self._call(s, "f_post", a, 1):
            s.status = STATUS_TRAP

    def _lift(self, s) -> None:
        data, size = self.memory(s)
        mem = np.frombuffer(self.ffi.buffer(data, size), dtype=np.uint8)
        rd = lambda off: int(mem[off:off + 4].view(np.uint32)[0])  # noqa: E731
        if s.result_ptr + 8 > size:
            s.status = STATUS_BAD_RESULT
            return
        s.branches_ptr, s.n_branches = rd(s.result_ptr), rd(s.result_ptr + 4)
        if s.branches_ptr + s.n_branches * 28 > size:
            s.status = STATUS_BAD_RESULT
            return
        b = s.branches_ptr
        if s.n_branches != 1 or mem[b] == 0 or rd(b + 24) != 0:
            s.status = STATUS_LIFT
            return
        s.temp_is_some = int(mem[b + 12] != 0)
        s.temp = float(mem[b + 16:b + 20].view(np.float32)[0])
        mptr, mlen = rd(b + 4), rd(b + 8)
        if mlen != s.mask_words or mptr + mlen * 4 > size:
            s.status = STATUS_BAD_MASK
            return
        self.ffi.memmove(s.mask_row, data + mptr, mlen * 4)
        row = np.frombuffer(self.ffi.buffer(s.mask_row, mlen * 4), dtype=np.uint32)
        tail = s.vocab_size % 32
        if tail and int(row[-1]) >> tail:
            s.status = STATUS_BAD_MASK
            return
        if not row.any():
            s.status = STATUS_EMPTY_MASK
            return
        s.status = STATUS_OK
        self.post(s)

    def step(self, s) -> None:
        t0 = time.perf_counter()
        s.error = s.trap = self.ffi.NULL
        s.n_branches = 0
        self.lib.wasmtime_context_set_epoch_deadline(s.ctx, s.deadline_ticks)
        tokens = self._write_list(s, s.tokens, s.n_tokens)
        group = -1 if tokens < 0 else self._write_list(s, s.group, s.n_group)
        if group >= 0:
            a = self.ffi.new("wt_val_raw_t[7]")
            for i, v in enumerate((s.backtrack, tokens, s.n_tokens, s.sampled_is_some, s.sampled, group, s.n_group)):
                a[i].i32 = v - (1 << 32) if v >= 1 << 31 else v
            if self._call(s, "f_mid", a, 7):
                s.result_ptr = a[0].i32 & 0xFFFFFFFF
                self._lift(s)
            else:
                s.status = STATUS_TRAP
        s.elapsed_us = (time.perf_counter() - t0) * 1e6
        s.done = 1


class ThreadPool:
    """The worker pool over Python threads (same interface as step.c's pool)."""

    def __init__(self, impl: Fallback, workers: int) -> None:
        self.impl = impl
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aicirt-worker")

    def submit(self, slots: list) -> None:
        for s in slots:
            self.executor.submit(self.impl.step, s)

    def wait(self, slots: list, timeout_s: float) -> int:
        deadline = time.perf_counter() + timeout_s
        while True:
            left = sum(1 for s in slots if not s.done)
            if not left or time.perf_counter() >= deadline:
                return left
            time.sleep(0.0002)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
