"""One engine step's worth of `mid-process` calls: submit now, run on workers, collect at wait().

The common result (one branch, a mask, no splices) is lifted by the hot path straight into the
batch's mask row. Everything else is read by `lift.py` from a numpy view of linear memory; here
it is placed in mask rows and forks are made; its post-return runs on the worker, first thing in
the sequence's next call (`Native.defer_post`). Any violation ends only
that sequence. Sequence states change only through the sequence's own transitions.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterable

import numpy as np

from .abi import Stage, Status
from .errors import ControllerError
from .lift import InvalidResult, check_temperature, read_branches, status_message
from .results import Branch, StepInput, StepResult
from .sequence import Sequence, SeqState

if TYPE_CHECKING:
    from .runtime import Runtime


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
    next-but-one submit) and `results`, one per submitted item, in order."""

    def __init__(self, masks: np.ndarray, results: list[StepResult], wait_us: float, blocked_us: float):
        self.masks = masks
        self.results = results
        self.wait_us = wait_us        # all of wait(): blocking plus lifting results
        self.blocked_us = blocked_us  # blocked on controllers still running: the time not hidden


def _check_items(runtime: "Runtime", items: list) -> None:
    """Misuse is refused before anything runs: ValueError (TypeError for a wrong item type)."""
    seen: set[int] = set()
    for item in items:
        if not isinstance(item, StepInput):
            raise TypeError(f"Runtime.submit takes aicirt.StepInput items, got {type(item).__name__}")
        seq = item.seq
        if not isinstance(seq, Sequence) or seq.runtime is not runtime:
            raise ValueError(f"{item.seq!r} is not a sequence of this runtime")
        if id(seq) in seen:
            raise ValueError(f"sequence {seq.id} is submitted twice in one batch")
        seen.add(id(seq))
        if seq.state in (SeqState.CLOSING, SeqState.CLOSED):
            raise ValueError(f"sequence {seq.id} is closed")
        if seq.state is SeqState.RUNNING:
            raise ValueError(f"sequence {seq.id} is in a batch that has not been waited for")


class BatchHandle:
    """Returned by :meth:`Runtime.submit`; the controllers run until :meth:`wait`, which may be
    called once."""

    def __init__(self, runtime: "Runtime", items: Iterable[StepInput]):
        runtime._check_open()
        items = list(items)
        _check_items(runtime, items)
        self.rt = runtime
        self.native = native = runtime.native
        W = runtime.mask_words
        self.masks = runtime._masks.take(len(items), runtime._pinned_buffers())
        self._extra: list[np.ndarray] = []
        self.results: list[StepResult | None] = [None] * len(items)
        self._running: list[tuple[int, Sequence]] = []
        self._late: list[tuple[int, Sequence]] = []   # calls from earlier steps, still out
        self._waited = False
        base = self.masks.ctypes.data
        for i, item in enumerate(items):
            seq = item.seq
            if seq.finished:
                self.results[i] = StepResult(seq, "error", error=seq.error or "sequence has stopped")
            elif seq.state is SeqState.LATE:
                self._late.append((i, seq))
            else:
                try:
                    seq._start(item, native.ffi.cast("uint32_t *", base + i * W * 4), (self.masks, i))
                except ValueError as e:   # the engine's mistake; still only this sequence's problem
                    seq._finish(f"invalid step input: {e}")
                    self.results[i] = StepResult(seq, "error", error=seq.error)
                    continue
                self._running.append((i, seq))
        if self._running:
            runtime._pool.submit([seq.slot for _, seq in self._running])

    def wait(self, timeout_s: float | None = None) -> BatchOutcome:
        """Collect results. Sequences not done within the soft deadline (`timeout_s`, default
        Limits.soft_deadline_s) are "pending": they no-op this step and their result comes with
        a later step. Only a call that has started and is not a first call counts towards
        Limits.max_late_steps: a call still queued behind others, or a first call (bounded by
        Limits.first_call_timeout_s), is simply pending. Raises ValueError if called twice."""
        if self._waited:
            raise ValueError("this batch was already waited for (BatchHandle.wait may be called once)")
        self._waited = True
        t0 = time.perf_counter()
        limits = self.rt.limits
        budget = limits.soft_deadline_s if timeout_s is None else timeout_s
        slots = [seq.slot for _, seq in self._running] + [seq.slot for _, seq in self._late]
        if slots and not self.rt.closed:
            self.rt._pool.wait(slots, budget)
        blocked_us = (time.perf_counter() - t0) * 1e6
        for i, seq in self._late + self._running:
            self.results[i] = self._settle(i, seq)
        masks = np.concatenate([self.masks, *self._extra]) if self._extra else self.masks
        self.rt._reap()
        return BatchOutcome(masks, self.results, (time.perf_counter() - t0) * 1e6, blocked_us)  # type: ignore[arg-type]

    def _settle(self, i: int, seq: Sequence) -> StepResult:
        if seq.state in (SeqState.CLOSING, SeqState.CLOSED):   # closed by its owner meanwhile
            if seq.state is SeqState.CLOSING and seq.slot.done:
                seq._collected()
            return StepResult(seq, "error", error="sequence was closed")
        if not seq.slot.done:
            counts = seq.calls > 1 and self.native.late_is_own(seq.slot, self.rt.limits.soft_deadline_s)
            late = seq._mark_late(counts)
            if late >= self.rt.limits.max_late_steps:
                stage = Stage(seq.slot.stage)   # where the worker is stuck (it writes this as it goes)
                where = "" if stage is Stage.MID_PROCESS else f", in {stage.where}"
                seq._finish(f"controller was late {late} steps in a row "
                            f"(soft deadline {self.rt.limits.soft_deadline_s * 1e3:g} ms{where})")
                return StepResult(seq, "error", error=seq.error)
            return StepResult(seq, "pending")
        assert seq.mask_buffer is not None   # a call is out: _start set it
        masks, row = seq.mask_buffer
        return self._collect(i, seq, None if masks is self.masks and row == i else masks[row])

    # -- lifting -------------------------------------------------------------------------------
    def _collect(self, i: int, seq: Sequence, src_row: np.ndarray | None) -> StepResult:
        s = seq.slot
        status = s.status
        try:
            if status == Status.OK:
                if src_row is not None:   # an earlier step's call: its mask sits in that step's array
                    self.masks[i] = src_row
                temperature = check_temperature(float(s.temp), 0) if s.temp_is_some else None
                result = StepResult(seq, "ok", [Branch(i, temperature)])
            elif status == Status.LIFT:
                result = self._lift(i, seq)
            elif status == Status.TRAP:
                stage = Stage(s.stage)
                where = "" if stage is Stage.MID_PROCESS else f"{stage.where}: "
                raise InvalidResult(where + self.native.error_text(s))
            elif status == Status.BAD_RESULT:
                raise InvalidResult(f"mid-process returned result pointer {s.result_ptr} (branch list at "
                                    f"{s.branches_ptr}, {s.n_branches} branches) outside linear memory")
            else:
                raise InvalidResult(status_message(status, s.detail[0], s.detail[1], self.rt.vocab_size))
        except InvalidResult as e:
            result = StepResult(seq, "error", error=str(e))
        result.logs = seq._take_call_log()
        result.elapsed_us = s.elapsed_us
        seq._collected()
        if result.status == "error":
            seq._finish(result.error)
        elif result.is_stop:
            seq._finish()
        return result

    def _lift(self, i: int, seq: Sequence) -> StepResult:
        rt, s = self.rt, seq.slot
        ptr, size = self.native.memory(s)
        mem = np.frombuffer(self.native.ffi.buffer(self.native.ffi.cast("uint8_t *", ptr), size), dtype=np.uint8)
        req = seq.request
        lifted = read_branches(mem, s.branches_ptr, s.n_branches, vocab_size=rt.vocab_size,
                               capabilities=req.capabilities, n_seen=len(seq.seen),
                               forks_left=rt.limits.max_forks - req.forks, limits=rt.limits,
                               check_mask=self.native.check_mask)
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
        self.native.defer_post(s)
        forks: list[Sequence] = []
        if len(branches) > 1:
            try:
                forks = seq._fork(len(branches) - 1)
            except ControllerError as e:   # e.g. no free instance slot: only this sequence fails
                raise InvalidResult(str(e)) from None
        return StepResult(seq, "ok", branches, forks)
