"""One engine step's worth of `mid-process` calls: submit now, run on workers, collect at wait().

The common result (one branch, a mask, no splices) is lifted in C straight into the batch's mask
row. Everything else is read by `lift.py` from a numpy view of linear memory; here it is placed
in mask rows, post-return is called and forks are made. Any violation ends only that sequence.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterable

import numpy as np

from .errors import ControllerError
from .host_imports import clear_stale_exception
from .lift import InvalidResult, check_temperature, read_branches
from .native import (
    STATUS_BAD_ALLOC,
    STATUS_BAD_MASK,
    STATUS_BAD_RESULT,
    STATUS_EMPTY_MASK,
    STATUS_LIFT,
    STATUS_OK,
    STATUS_TRAP,
    get_native,
)
from .results import Branch, StepInput, StepResult

if TYPE_CHECKING:
    from .runtime import Runtime
    from .sequence import Sequence


class MaskBuffers:
    """Two alternating mask arrays, reused so steady-state steps write to resident pages (a fresh
    array costs a page fault per 4 KiB on first write: ~10 µs p99 per sequence-step at 151k).

    An outcome's `masks` therefore stays valid until the next-but-one `submit`. A buffer that a
    late call may still write into is never reused. Rows no branch refers to hold stale data."""

    def __init__(self, words: int) -> None:
        self.words = words
        self.buffers: list[np.ndarray | None] = [None, None]
        self.turn = 0

    def take(self, rows: int, pinned: set[int]) -> np.ndarray:
        self.turn ^= 1
        buf = self.buffers[self.turn]
        if buf is None or buf.shape[0] < rows or id(buf) in pinned:
            buf = self.buffers[self.turn] = np.empty((max(rows, 8), self.words), dtype=np.uint32)
        return buf[:rows]


class BatchOutcome:
    """What `BatchHandle.wait` returns: `masks` (uint32 [rows, ceil(V/32)], valid until the
    next-but-one submit) and `results`."""

    def __init__(self, masks: np.ndarray, results: list[StepResult], wait_us: float, blocked_us: float):
        self.masks = masks
        self.results = results
        self.wait_us = wait_us        # all of wait(): blocking plus lifting results
        self.blocked_us = blocked_us  # blocked on controllers still running: the time not hidden


class BatchHandle:
    """Returned by :meth:`Runtime.submit`; the controllers run until :meth:`wait`."""

    def __init__(self, runtime: "Runtime", items: Iterable[tuple]):
        self.rt = runtime
        native = self.native = get_native()
        items = [it if isinstance(it, StepInput) else StepInput(*it) for it in items]
        W = runtime.mask_words
        self.masks = runtime._masks.take(len(items), {id(s.in_flight[0].base) for s in runtime._in_flight})
        self._extra: list[np.ndarray] = []
        self.results: list[StepResult | None] = [None] * len(items)
        self._running: list[tuple[int, "Sequence"]] = []
        self._late: list[tuple[int, "Sequence"]] = []   # calls from earlier steps, still out
        self._first_call = False
        base = self.masks.ctypes.data
        for i, item in enumerate(items):
            seq, tokens, sampled = item.seq, item.tokens, item.sampled
            hint = () if item.unchanged is None else (item.unchanged,)
            if seq.finished:
                self.results[i] = StepResult(seq, "error", error=seq.error or "sequence has stopped")
            elif seq.in_flight is not None:
                self._late.append((i, seq))
            else:
                try:
                    seq.prepare(tokens, sampled, native.ffi.cast("uint32_t *", base + i * W * 4), *hint)
                except ValueError as e:   # the engine's mistake; still only this sequence's problem
                    seq.error = f"invalid step input: {e}"
                    self.results[i] = StepResult(seq, "error", error=seq.error)
                    continue
                self._first_call |= seq.calls == 1
                self._running.append((i, seq))
        for i, seq in self._running:
            seq.in_flight = (self.masks, i)
            runtime._in_flight.add(seq)
        if self._running:
            runtime._pool.submit([seq.slot for _, seq in self._running])

    def _still_late(self, i: int, seq: "Sequence") -> None:
        seq.late_steps += 1
        if seq.late_steps >= self.rt.limits.max_late_steps:
            seq.error = f"controller was late {seq.late_steps} steps in a row (soft deadline {self.rt.limits.soft_deadline_s * 1e3:g} ms)"
            self.results[i] = StepResult(seq, "error", error=seq.error)
        else:
            self.results[i] = StepResult(seq, "pending")

    def wait(self, timeout_s: float | None = None) -> BatchOutcome:
        """Collect results. Sequences not done within the soft deadline (`timeout_s`, default
        Limits.soft_deadline_s; the first call of a sequence gets first_call_timeout_s) are
        "pending": they no-op this step and their result comes with a later step."""
        t0 = time.perf_counter()
        limits = self.rt.limits
        budget = limits.soft_deadline_s if timeout_s is None else timeout_s
        if self._first_call:
            budget = max(budget, limits.first_call_timeout_s + 0.1)
        slots = [seq.slot for _, seq in self._running] + [seq.slot for _, seq in self._late]
        if slots:
            self.rt._pool.wait(slots, budget)
        blocked_us = (time.perf_counter() - t0) * 1e6
        for i, seq in self._late:
            if seq.slot.done:   # an earlier step's call: its mask sits in that step's array
                masks, row = seq.in_flight
                self.results[i] = self._collect(i, seq, masks[row])
            else:
                self._still_late(i, seq)
        for i, seq in self._running:
            if seq.slot.done:
                self.results[i] = self._collect(i, seq, None)
            else:
                self._still_late(i, seq)
        masks = np.concatenate([self.masks, *self._extra]) if self._extra else self.masks
        self.rt._reap()
        return BatchOutcome(masks, self.results, (time.perf_counter() - t0) * 1e6, blocked_us)

    # -- lifting -------------------------------------------------------------------------------
    def _collect(self, i: int, seq: "Sequence", src_row: np.ndarray | None) -> StepResult:
        s = seq.slot
        seq.in_flight = None
        self.rt._in_flight.discard(seq)
        seq.late_steps = 0
        status = s.status
        try:
            if status == STATUS_OK:
                if src_row is not None:
                    self.masks[i] = src_row
                temperature = check_temperature(float(s.temp), 0) if s.temp_is_some else None
                result = StepResult(seq, "ok", [Branch(i, temperature)])
            elif status == STATUS_LIFT:
                result = self._lift(i, seq)
            elif status == STATUS_TRAP:
                clear_stale_exception()
                raise InvalidResult(seq.fault or self.native.error_text(s))
            elif status in (STATUS_BAD_MASK, STATUS_EMPTY_MASK):
                self._lift(i, seq)  # re-validates and raises the precise message
                raise InvalidResult("invalid mask")
            else:
                raise InvalidResult(self._bad_pointer_text(s, status))
        except InvalidResult as e:
            seq.error = str(e)
            result = StepResult(seq, "error", error=seq.error)
        result.logs = seq.take_call_log()
        result.elapsed_us = s.elapsed_us
        if result.status == "ok" and not result.branches:
            seq.stopped = True
        if seq.finished and seq._close_pending:
            seq.close()
        return result

    def _bad_pointer_text(self, s, status: int) -> str:
        _, size = self.native.memory(s)
        if status == STATUS_BAD_ALLOC:
            return f"cabi_realloc returned memory outside linear memory ({size} bytes) for the arguments"
        if status == STATUS_BAD_RESULT:
            return (f"mid-process returned result pointer {s.result_ptr} (branch list at {s.branches_ptr}, "
                    f"{s.n_branches} branches) outside linear memory ({size} bytes)")
        return f"internal: unknown status {status}"

    def _lift(self, i: int, seq: "Sequence") -> StepResult:
        rt, s = self.rt, seq.slot
        ptr, size = self.native.memory(s)
        mem = np.frombuffer(self.native.ffi.buffer(ptr, size), dtype=np.uint8)
        lifted = read_branches(mem, s.branches_ptr, s.n_branches, vocab_size=rt.vocab_size,
                               capabilities=seq.request.capabilities, n_seen=len(seq.seen),
                               forks_left=rt.limits.max_forks - seq.request.forks, max_forks=rt.limits.max_forks)
        branches = []
        for k, (mask, temperature, splices) in enumerate(lifted):
            row = None
            if mask is not None:
                if k == 0:
                    row = i
                    self.masks[i] = mask
                else:
                    row = len(self.masks) + len(self._extra)
                    self._extra.append(mask[None, :])
            branches.append(Branch(row, temperature, splices))
        n = len(branches)
        self.native.post(s)
        if s.status == STATUS_TRAP:
            raise InvalidResult("cabi_post_mid-process: " + (seq.fault or self.native.error_text(s)))
        forks = []
        if n > 1:
            try:
                for _ in range(n - 1):
                    forks.append(seq.fork())
            except ControllerError as e:   # e.g. no free instance slot: only this sequence fails
                for child in forks:
                    child.close()
                raise InvalidResult(f"fork failed: {e}") from None
            seq.request.forks += n - 1
            group = [seq.id] + [c.id for c in forks]
            for member in (seq, *forks):
                member.fork_group = group
        return StepResult(seq, "ok", branches, forks)
