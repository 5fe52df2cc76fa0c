"""One engine step's worth of `mid-process` calls: submit now, run on workers, collect at wait().

The common result (one branch, a mask, no splices) is lifted in C straight into the batch's mask
row. Everything else is lifted here from a numpy view of linear memory and validated against
SPEC §3; any violation ends only that sequence, with a message saying what the controller did.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Iterable

import numpy as np

from . import abi
from .capabilities import Capabilities
from .errors import ControllerError
from .host_imports import clear_stale_exception
from .native import (STATUS_BAD_ALLOC, STATUS_BAD_MASK, STATUS_BAD_RESULT, STATUS_EMPTY_MASK, STATUS_LIFT,
                     STATUS_OK, STATUS_TRAP, get_native)
from .results import Branch, Splice, StepResult

if TYPE_CHECKING:
    from .runtime import Runtime
    from .sequence import Sequence


class InvalidResult(Exception):
    """The controller's result breaks the contract; the message says how."""


def _temperature(value: float, k: int) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise InvalidResult(f"branch {k}: temperature {value} is not a finite number >= 0")
    return value


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

    def __init__(self, runtime: "Runtime", items: Iterable[tuple["Sequence", list[int], int | None]]):
        self.rt = runtime
        native = self.native = get_native()
        items = list(items)
        W = runtime.mask_words
        self.masks = runtime._masks.take(len(items), {id(s.in_flight[0].base) for s in runtime._in_flight})
        self._extra: list[np.ndarray] = []
        self.results: list[StepResult | None] = [None] * len(items)
        self._running: list[tuple[int, "Sequence"]] = []
        self._late: list[tuple[int, "Sequence"]] = []   # calls from earlier steps, still out
        self._first_call = False
        base = self.masks.ctypes.data
        for i, (seq, tokens, sampled) in enumerate(items):
            if seq.finished:
                self.results[i] = StepResult(seq, "error", error=seq.error or "sequence has stopped")
            elif seq.in_flight is not None:
                self._late.append((i, seq))
            else:
                try:
                    seq.prepare(tokens, sampled, native.ffi.cast("uint32_t *", base + i * W * 4))
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
                temperature = _temperature(float(s.temp), 0) if s.temp_is_some else None
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
        u32 = lambda off: int(mem[off:off + 4].view(np.uint32)[0])  # noqa: E731
        n, bptr = s.n_branches, s.branches_ptr
        caps = seq.request.capabilities
        if n > 1:
            if not caps & Capabilities.FORK:
                raise InvalidResult(f"returned {n} branches (a fork) but capability `fork` was not granted")
            if seq.request.forks + n - 1 > rt.limits.max_forks:
                raise InvalidResult(f"fork into {n} branches exceeds the limit of {rt.limits.max_forks} forks per request")
        branches = []
        for k in range(n):
            b = bptr + k * abi.BRANCH_SIZE
            has_mask = mem[b] != 0
            row = None
            if has_mask:
                row = i if k == 0 else len(self.masks) + len(self._extra)
                mask = self._read_mask(mem, size, u32(b + 4), u32(b + 8), k)
                if k == 0:
                    self.masks[i] = mask
                else:
                    self._extra.append(mask[None, :])
            temperature = _temperature(float(mem[b + 16:b + 20].view(np.float32)[0]), k) if mem[b + 12] else None
            splices = self._read_splices(mem, size, u32(b + 20), u32(b + 24), k, has_mask, len(seq.seen), caps)
            if not has_mask and (len(splices) != 1 or splices[0].when_sampled):
                raise InvalidResult(f"branch {k} has no mask, so it needs exactly one unconditional splice, got {len(splices)}")
            branches.append(Branch(row, temperature, tuple(splices)))
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

    def _read_mask(self, mem: np.ndarray, size: int, ptr: int, words: int, k: int) -> np.ndarray:
        rt = self.rt
        if words != rt.mask_words:
            raise InvalidResult(f"branch {k}: mask has {words} words, expected ceil({rt.vocab_size}/32) = {rt.mask_words}")
        if ptr + words * 4 > size:
            raise InvalidResult(f"branch {k}: mask [{ptr}, {ptr + words * 4}) is outside linear memory ({size} bytes)")
        mask = mem[ptr:ptr + words * 4].view(np.uint32)
        tail = rt.vocab_size % 32
        extra = int(mask[-1]) >> tail if tail else 0
        if extra:
            first = (words - 1) * 32 + tail + (extra & -extra).bit_length() - 1
            raise InvalidResult(f"branch {k}: mask allows token {first} >= vocab size {rt.vocab_size}")
        if not mask.any():
            raise InvalidResult(f"branch {k}: mask allows no token")
        return mask.copy()

    def _read_tokens(self, mem, size, ptr: int, n: int, what: str) -> tuple[int, ...]:
        if ptr + n * 4 > size:
            raise InvalidResult(f"{what}: list [{ptr}, {ptr + n * 4}) is outside linear memory ({size} bytes)")
        ids = mem[ptr:ptr + n * 4].view(np.uint32)
        if n and int(ids.max()) >= self.rt.vocab_size:
            raise InvalidResult(f"{what}: token id {int(ids.max())} >= vocab size {self.rt.vocab_size}")
        return tuple(int(t) for t in ids)

    def _read_splices(self, mem, size, ptr, n, k, has_mask, n_seen, caps) -> list[Splice]:
        if ptr + n * abi.SPLICE_SIZE > size:
            raise InvalidResult(f"branch {k}: splice list is outside linear memory")
        out = []
        limit = n_seen + (1 if has_mask else 0)
        for j in range(n):
            p = ptr + j * abi.SPLICE_SIZE
            f = mem[p:p + abi.SPLICE_SIZE].view(np.uint32)
            where = f"branch {k} splice {j}"
            when = self._read_tokens(mem, size, int(f[0]), int(f[1]), where + " when-sampled")
            backtrack = int(f[2])
            ff = self._read_tokens(mem, size, int(f[3]), int(f[4]), where + " ff-tokens")
            if when and not caps & Capabilities.CONDITIONAL_FF_TOKENS:
                raise InvalidResult(f"{where}: conditional splice but capability `conditional-ff-tokens` was not granted")
            if backtrack and not caps & Capabilities.BACKTRACK:
                raise InvalidResult(f"{where}: backtrack {backtrack} but capability `backtrack` was not granted")
            if ff and not caps & Capabilities.FF_TOKENS:
                raise InvalidResult(f"{where}: fast-forward tokens but capability `ff-tokens` was not granted")
            if backtrack > limit:
                raise InvalidResult(f"{where}: backtrack {backtrack} reaches past the start of the sequence ({limit} tokens)")
            out.append(Splice(when, backtrack, ff))
        return out
