"""One engine step's worth of `mid-process` calls: submit now, run on workers, collect at wait().

Two layers over one implementation:

* the rows API (:class:`RowsHandle`, from :meth:`Runtime.submit_rows`): sequences addressed by
  their integer `index`, inputs and outputs as arrays. The common row (the sampled token
  appended; one branch with a mask back) is prepared, run and collected by the hot path with no
  Python object per sequence: the caller gets `kind`, `temperature` and the mask matrix. Only
  the rare rows (splices, forks, stop, errors, logs, late calls) are lifted into
  :class:`StepResult` objects, in `RowsOutcome.results`.
* the object API (:class:`BatchHandle`, from :meth:`Runtime.submit`): `StepInput`s in, one
  `StepResult` per item out; a thin layer that builds the rows' arrays and wraps their results.

A rare result is read by `lift.py` from a numpy view of linear memory; here it is placed in mask
rows and forks are made; its post-return runs on the worker, first thing in the sequence's next
call (`Native.defer_post`). Any violation ends only that sequence. Sequence states change only
through the sequence's own transitions.
"""
from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence as Seq

import numpy as np

from ..abi import RowKind, RowStatus, Stage, Status
from ..errors import ControllerError
from .lift import InvalidResult, check_temperature, read_branches, status_message
from ..native import EditArrays
from .results import Branch, StepInput, StepResult, mask_result
from .sequence import Sequence, SeqState

if TYPE_CHECKING:
    from .runtime import Runtime

_stamps = itertools.count(1)   # one per batch, process-wide: a slot never sees one twice
_MASK, _PENDING, _OTHER = int(RowKind.MASK), int(RowKind.PENDING), int(RowKind.OTHER)   # (enum lookups cost µs)
_MISUSE = {1: "is submitted twice in one batch", 2: "is in a batch that has not been waited for", 3: "is closed"}
_NO_SEQUENCE = 5   # aicirt_rows_submit: no live sequence at that index
_I64, _I32 = np.dtype(np.int64), np.dtype(np.int32)   # numpy's own dtype objects: `is`, not `==` (0.2 µs each)
_STALE = 6         # aicirt_rows_start: the object API's copy of the tokens a controller saw is stale


class _StaleRows(Exception):
    """The object API's copy of what these rows' controllers saw is stale (the rows API moved them
    on meanwhile); nothing started."""

    def __init__(self, rows: "list[int]"):
        super().__init__(rows)
        self.rows = rows


class RowsOutcome:
    """What `RowsHandle.wait` returns, one row per submitted row:

    - `kind[i]` (:class:`aicirt.RowKind`): MASK (sample under `masks[i]` at `temperature[i]`,
      NaN: the request's own), PENDING (late: no-op this step), OTHER (see `results[i]`);
    - `masks`: uint32 [rows (+ extra rows for forks' branches), ceil(V/32)], valid until the
      next-but-one submit; `results[i]` refers to its rows by `Branch.mask_row`;
    - `results`: a StepResult for each row that is not MASK (and for late ones);
    - `elapsed_us[i]`: its call's time (0 for rows not run).

    `kind`, `temperature` and `elapsed_us` are, as `masks`, valid until the next-but-one submit
    (the runtime reuses their memory after that: copy what you keep longer).
    """

    __slots__ = ("masks", "kind", "temperature", "elapsed_us", "results", "wait_us", "blocked_us")

    def __init__(self, masks: np.ndarray, kind: np.ndarray, temperature: np.ndarray, elapsed_us: np.ndarray,
                 results: dict[int, StepResult], wait_us: float, blocked_us: float):
        self.masks = masks
        self.kind = kind
        self.temperature = temperature
        self.elapsed_us = elapsed_us
        self.results = results
        self.wait_us = wait_us        # all of wait(): blocking plus lifting results
        self.blocked_us = blocked_us  # blocked on controllers still running: the time not hidden


class BatchOutcome:
    """What `BatchHandle.wait` returns: `masks` (uint32 [rows, ceil(V/32)], valid until the
    next-but-one submit) and `results`, one per submitted item, in order."""

    def __init__(self, masks: np.ndarray, results: list[StepResult], wait_us: float, blocked_us: float):
        self.masks = masks
        self.results = results
        self.wait_us = wait_us
        self.blocked_us = blocked_us


def _int_array(values: object, name: str, dtype: type) -> np.ndarray:
    if type(values) is np.ndarray and values.dtype == dtype and values.ndim == 1 and values.flags.c_contiguous:
        return values   # the engine's own arrays: nothing to convert (RowsHandle inlines this test)
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(f"{name} must be a one-dimensional array of integers, got {arr.dtype} of shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=dtype)


class RowsHandle:
    """Returned by :meth:`Runtime.submit_rows`; the controllers run until :meth:`wait`, which may
    be called once. Raises in the constructor, before anything runs, for misuse (see there)."""

    __slots__ = ("rt", "registry", "index", "sampled", "edits", "masks", "scratch", "_extra", "_waited", "_held",
                 "started")

    def __init__(self, runtime: "Runtime", index: object, sampled: object,
                 edits: "Mapping[int, tuple[Seq[int] | np.ndarray, int]] | EditArrays | None" = None,
                 *, _object_api: bool = False, _expect_seen: np.ndarray | None = None):
        self.rt = runtime
        self.registry = registry = runtime.registry
        self.index: np.ndarray
        self.sampled: np.ndarray
        if _object_api:   # BatchHandle checked the runtime and made both arrays (int64 and int32, contiguous)
            self.index, self.sampled = index, sampled   # type: ignore[assignment]
            n = len(self.index)
        else:
            runtime.check_open()
            # the engine's own arrays pass as they are (the test inlined: it is most of this call)
            self.index = index if (type(index) is np.ndarray and index.dtype is _I64 and index.ndim == 1
                                   and index.flags.c_contiguous) else _int_array(index, "index", np.int64)
            n = len(self.index)
            self.sampled = sampled if (type(sampled) is np.ndarray and sampled.dtype is _I32 and sampled.ndim == 1
                                       and sampled.flags.c_contiguous) else \
                _int_array(sampled, "sampled", np.int32) if n else np.empty(0, np.int32)
            if len(self.sampled) != n:
                raise ValueError(f"sampled has {len(self.sampled)} entries for {n} rows")
        self.edits = edits if edits is None or isinstance(edits, EditArrays) else _edit_arrays(edits, n)
        if self.edits is not None:
            if len(self.edits.of_row) != n:
                raise ValueError(f"edits cover {len(self.edits.of_row)} rows, the batch has {n}")
            vocab = runtime.vocab_size
            bad = self._bad_edit_rows(vocab)
            if bad:
                registry.ptrs(self.index)   # an index that is no live sequence raises first
            for row, token in bad:
                registry.at(int(self.index[row])).finish(f"invalid step input: token {token} is not a token id "
                                                          f"of this vocabulary (0..{vocab - 1})")
        self.masks = registry.take_masks(n)
        self.scratch = scratch = registry.scratch.take(n)
        self._extra: list[np.ndarray] = []
        self._waited = False
        # the rows' slots from the registry's table, their edits applied, their calls queued: one call
        rc, self._held = runtime.pool.submit_rows(registry.table, self.index, self.sampled, self.edits, self.masks,
                                                  runtime.mask_words, next(_stamps), scratch, _expect_seen)
        self.started = rc   # how many rows' calls started
        if rc < 0:
            scratch.busy = False   # nothing started
            row, why = -rc - 1, int(scratch.row_status[-rc - 1])
            if why == _STALE:
                raise _StaleRows(np.flatnonzero(scratch.row_status[:n] == _STALE).tolist())
            if why == _NO_SEQUENCE:
                registry.ptrs(self.index)   # raises, naming what is wrong with the index
            seq = registry.at(int(self.index[row]))
            raise ValueError(f"sequence {seq.id} {_MISUSE.get(why, 'could not be queued')}")
        if self.edits is not None and not _object_api:
            # edited through the rows API: the object API's copy of those rows' tokens is stale (a
            # plain row only appends: the hot path sees that from the count, see `expect_seen`)
            for row in np.flatnonzero(self.edits.of_row >= 0).tolist():
                registry.at(int(self.index[row])).sent_tokens = None

    def _bad_edit_rows(self, vocab: int) -> list[tuple[int, int]]:
        """The rows whose edit holds a token past the vocabulary (the engine's mistake: still only
        those sequences' problem), each with its first such token."""
        e = self.edits
        if e is None or not e.tokens.size or int(e.tokens.max()) < vocab:
            return []
        out = []
        bad_at = np.flatnonzero(e.tokens >= vocab)
        edits = np.searchsorted(e.offsets, bad_at, side="right") - 1
        for edit in np.unique(edits).tolist():
            first = int(bad_at[np.argmax(edits == edit)])
            for row in np.flatnonzero(e.of_row == edit).tolist():
                out.append((row, int(e.tokens[first])))
        return out

    def wait(self, timeout_s: float | None = None) -> RowsOutcome:
        """Collect results. Rows not done within the soft deadline (`timeout_s`, default
        Limits.soft_deadline_s) are PENDING: they no-op this step and their result comes with a
        later step. Only a call that has started and is not a first call counts towards
        Limits.max_late_steps: a call still queued behind others, or a first call (bounded by
        Limits.first_call_timeout_s), is simply pending. Raises ValueError if called twice."""
        return RowsOutcome(*self._finish(timeout_s))

    def _finish(self, timeout_s: float | None) -> tuple:
        """wait()'s work: RowsOutcome's fields in its order (the object API takes them as they are)."""
        if self._waited:
            raise ValueError("this batch was already waited for (wait may be called once)")
        self._waited = True
        t0 = time.perf_counter()
        rt, sc = self.rt, self.scratch
        # wait (running still-queued calls here where the caller-runs rule allows), then collect: one call
        other = rt.pool.finish_rows(sc, self._held, rt.limits.soft_deadline_s if timeout_s is None else timeout_s,
                                    rt.closed)
        sc.busy = False   # the outcome's views into it stay valid until the next-but-one submit
        blocked_us = float(sc.blocked_us[0])
        st, kind, temperature, elapsed = sc.row_status, sc.kind, sc.temperature, sc.elapsed_us
        results: dict[int, StepResult] = {}
        if other:
            for i in np.flatnonzero(kind != _MASK).tolist():
                r = results[i] = self._rare(i, self.registry.at(int(self.index[i])), int(st[i]))
                kind[i] = _PENDING if r.status == "pending" else _OTHER
                elapsed[i] = r.elapsed_us
        masks = np.concatenate([self.masks, *self._extra]) if self._extra else self.masks
        for seq in self.registry.reap():
            seq.collected()
        return masks, kind, temperature, elapsed, results, (time.perf_counter() - t0) * 1e6, blocked_us

    # -- the rare rows -----------------------------------------------------------------------------
    def _rare(self, i: int, seq: Sequence, status: int) -> StepResult:
        if status == RowStatus.STOPPED:
            return StepResult(seq, "error", error=seq.error or "sequence has stopped")
        if status in (RowStatus.BAD_TOKEN, RowStatus.NO_MEMORY, RowStatus.BAD_EDIT):
            vocab = self.rt.vocab_size
            seq.finish("invalid step input: " + (
                f"token {seq.slot.detail[0]} is not a token id of this vocabulary (0..{vocab - 1})"
                if status == RowStatus.BAD_TOKEN else
                "its token list could not grow (out of memory)" if status == RowStatus.NO_MEMORY else
                f"its edit keeps more tokens than the controller saw ({seq.slot.n_seen})"))
            return StepResult(seq, "error", error=seq.error)
        return self._settle(i, seq)

    def _settle(self, i: int, seq: Sequence) -> StepResult:
        if seq.state in (SeqState.CLOSING, SeqState.CLOSED):   # closed by its owner meanwhile
            if seq.state is SeqState.CLOSING:
                if seq.slot.done:
                    seq.collected()
                else:
                    self.registry.hold(seq, self.masks)   # its call may still write into this step's array
            return StepResult(seq, "error", error="sequence was closed")
        if not seq.slot.done:
            counts = seq.calls > 1 and self.rt.native.late_is_own(seq.slot, seq.late_steps,
                                                                   self.rt.limits.soft_deadline_s)
            late = seq.mark_late(self.masks, i, counts)
            if late >= self.rt.limits.max_late_steps:
                stage = Stage(seq.slot.stage)   # where the worker is stuck (it writes this as it goes)
                where = "" if stage is Stage.MID_PROCESS else f", in {stage.where}"
                seq.finish(f"controller was late {late} steps in a row "
                            f"(soft deadline {self.rt.limits.soft_deadline_s * 1e3:g} ms{where})")
                return StepResult(seq, "error", error=seq.error)
            return StepResult(seq, "pending")
        src_row = None
        if seq.mask_buffer is not None:   # an earlier step's call: its mask sits in that step's array
            masks, row = seq.mask_buffer
            src_row = masks[row]
        return self._collect(i, seq, src_row)

    def _collect(self, i: int, seq: Sequence, src_row: np.ndarray | None) -> StepResult:
        s = seq.slot
        status = s.status
        try:
            if status == Status.OK:
                if src_row is not None:
                    self.masks[i] = src_row
                temperature = check_temperature(float(s.temp), 0) if s.temp_is_some else None
                result = StepResult(seq, "ok", [Branch(i, temperature)])
            elif status == Status.LIFT:
                result = self._lift(i, seq)
            elif status == Status.TRAP:
                stage = Stage(s.stage)
                where = "" if stage is Stage.MID_PROCESS else f"{stage.where}: "
                raise InvalidResult(where + self.rt.native.error_text(s))
            elif status == Status.BAD_RESULT:
                raise InvalidResult(f"mid-process returned result pointer {s.result_ptr} (branch list at "
                                    f"{s.branches_ptr}, {s.n_branches} branches) outside linear memory")
            else:
                raise InvalidResult(status_message(status, s.detail[0], s.detail[1], self.rt.vocab_size))
        except InvalidResult as e:
            result = StepResult(seq, "error", error=str(e))
        result.logs = seq.take_call_log()
        result.elapsed_us = s.elapsed_us
        seq.collected()
        if result.status == "error":
            seq.finish(result.error)
        elif result.is_stop:
            seq.finish()
        return result

    def _lift(self, i: int, seq: Sequence) -> StepResult:
        rt, s = self.rt, seq.slot
        native = rt.native
        ptr, size = native.memory(s)
        mem = np.frombuffer(native.ffi.buffer(native.ffi.cast("uint8_t *", ptr), size), dtype=np.uint8)
        req = seq.request
        lifted = read_branches(mem, s.branches_ptr, s.n_branches, vocab_size=rt.vocab_size,
                               capabilities=req.capabilities, n_seen=int(s.n_seen),
                               forks_left=rt.limits.max_forks - req.forks, limits=rt.limits,
                               check_mask=native.check_mask)
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
        native.defer_post(s)
        forks: list[Sequence] = []
        if len(branches) > 1:
            try:
                forks = seq.fork_many(len(branches) - 1)
            except ControllerError as e:   # e.g. no free instance slot: only this sequence fails
                raise InvalidResult(str(e)) from None
        return StepResult(seq, "ok", branches, forks)


def row_edit(tokens: "list[int]", sampled: int | None, kept: int, synced: int) -> "tuple[list[int], int] | None":
    """The rows API's edit for a sequence whose full token list is `tokens`, `sampled` the token
    it sampled last step (None: none), `kept` the leading tokens unchanged since its last submit
    and `synced` how many tokens its controller saw then: None for the common row (the sampled
    token appended, or nothing changed), else (tokens past `kept`, `kept`)."""
    if kept == synced and len(tokens) == kept + (sampled is not None) and (sampled is None or tokens[-1] == sampled):
        return None
    return tokens[kept:], kept


def _edit_arrays(edits: "Mapping[int, tuple[Seq[int] | np.ndarray, int]]", n: int) -> EditArrays:
    """EditArrays from {row: (tokens past the first `unchanged`, unchanged)}."""
    of_row = np.full(n, -1, dtype=np.int32)
    parts, lengths, unchanged = [], [0], []
    for e, (row, (tokens, kept)) in enumerate(edits.items()):
        if not 0 <= row < n:
            raise ValueError(f"edit for row {row} of a batch of {n}")
        of_row[row] = e
        arr = np.asarray(tokens, dtype=np.int64) if len(tokens) else np.empty(0, np.int64)
        if arr.size and arr.min() < 0:
            raise ValueError(f"edit for row {row}: token {int(arr.min())} is negative")
        parts.append(arr)
        lengths.append(len(arr))
        unchanged.append(kept)
    flat = np.concatenate(parts).astype(np.uint32) if parts else np.empty(0, np.uint32)
    return EditArrays(of_row, np.cumsum(lengths, dtype=np.int64), flat, np.asarray(unchanged, dtype=np.uint32))


# -- the object API ------------------------------------------------------------------------------
# A thin layer over the rows API in cost too: each sequence keeps the token list its controller
# holds as a Python list (`Sequence.sent_tokens`, a copy), and a StepInput that is that list plus the
# sampled token is a plain row (the sampled token only): one list comparison, in C, and no
# conversion. Any other list (the prompt, a splice, a fork's first step, a list edited in place)
# is an edit from its longest common prefix with `sent_tokens`, found by comparing slices (in C); only
# the tokens past it are checked and converted.

_IDLE = SeqState.IDLE
_CLOSED = (SeqState.CLOSING, SeqState.CLOSED)


def _common_prefix(a: "list[int]", b: "list[int]") -> int:
    """The length of the longest common prefix of two lists, by slice comparisons (C loops):
    galloping back from the shorter length (splices change the tail), then bisecting."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo, step = 0, 1                  # invariant: prefix(lo) equal, prefix(hi) not
    while hi - step > lo:
        m = hi - step
        if a[:m] == b[:m]:
            lo = m
            break
        hi, step = m, step * 2
    while hi - lo > 1:
        m = (lo + hi) // 2
        if a[:m] == b[:m]:
            lo = m
        else:
            hi = m
    return lo


def _suffix_array(tokens: "Seq[int]", kept: int, vocab: int) -> "np.ndarray | str":
    """The tokens past `kept` as uint32, or why they are not token ids of the vocabulary."""
    suffix = tokens[kept:]
    if not len(suffix):
        return np.empty(0, np.uint32)
    try:
        arr = np.asarray(suffix)
    except (TypeError, ValueError, OverflowError):
        arr = np.asarray(suffix, dtype=object)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        bad = next((t for t in suffix if not (isinstance(t, int) and 0 <= t < vocab)), suffix[0])
        return f"token {bad!r} is not a token id of this vocabulary (0..{vocab - 1})"
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab:
        return f"token {lo if lo < 0 else hi!r} is not a token id of this vocabulary (0..{vocab - 1})"
    return arr.astype(np.uint32)


class BatchHandle:
    """Returned by :meth:`Runtime.submit`; the controllers run until :meth:`wait`, which may be
    called once."""

    def __init__(self, runtime: "Runtime", items: Iterable[StepInput]):
        runtime.check_open()
        items = items if type(items) is list else list(items)
        n = len(items)
        vocab = runtime.vocab_size
        sampled_list = [-1] * n
        expect = [-1] * n   # rows built on `sent_tokens`: how many tokens its controller saw (checked in C)
        seqs: list[Sequence] = [None] * n   # type: ignore[list-item]
        edits: dict[int, tuple[np.ndarray, int]] = {}
        # rows whose `sent_tokens` changes otherwise than by the in-place append of a common row:
        # (row, the whole list once started | None)
        fixups: list[tuple[int, "list[int] | None"]] = []
        bad: list[tuple[Sequence, str]] = []   # invalid inputs: finished once the batch is known to be no misuse
        # One pass, and for the common row (the list its controller holds plus the sampled token)
        # nothing but one list comparison (in C). The hot path refuses running and twice-submitted
        # rows, and rows whose `sent_tokens` is stale (the rows API moved them on: `expect`). A
        # closed one's index may already address another sequence, so that one is caught here: it
        # has no `sent_tokens`, so it never passes as a common row, and every other row checks
        # its `closed` flag.
        try:
            for i, item in enumerate(items):
                if type(item) is not StepInput and not isinstance(item, StepInput):
                    raise TypeError(f"Runtime.submit takes aicirt.StepInput items, got {type(item).__name__}")
                seq = seqs[i] = item.seq
                if type(seq) is not Sequence and not isinstance(seq, Sequence) or seq.runtime is not runtime:
                    raise ValueError(f"{item.seq!r} is not a sequence of this runtime")
                tokens, smp, unchanged = item.tokens, item.sampled, item.unchanged
                sent = seq.sent_tokens
                if sent is None and seq.closed:
                    _check_batch(seqs[:i + 1])   # raises: the first running or closed one, in row order
                if smp is not None and not (type(smp) is int and 0 <= smp < vocab):
                    if not (isinstance(smp, int) and 0 <= smp < vocab):
                        bad.append((seq, f"invalid step input: token {smp!r} is not a token id of this vocabulary "
                                         f"(0..{vocab - 1})"))
                        continue
                    smp = int(smp)
                if unchanged is not None:   # the caller's hint: the runtime compares only from there
                    if not (type(unchanged) is int and 0 <= unchanged <= len(tokens)):
                        if not (isinstance(unchanged, int) and 0 <= unchanged <= len(tokens)):
                            bad.append((seq, f"invalid step input: unchanged={unchanged!r} is not a prefix length "
                                             f"of the {len(tokens)} tokens"))
                            continue
                        unchanged = int(unchanged)
                    if sent is not None:
                        seq.sent_tokens = None   # a caller with hints pays for the suffix only: no copy kept
                    if smp is not None and unchanged == len(tokens) - 1 and tokens[-1] == smp:
                        sampled_list[i] = smp    # the common row, if its controller saw `unchanged` tokens
                        expect[i] = unchanged    # (the hot path checks; else compared from there, see _start_rows)
                        continue
                    kept = min(unchanged, int(seq.slot.n_seen))
                else:
                    if type(tokens) is not list:   # a tuple, a numpy array: compared as a list of ints
                        tokens = _as_list(tokens)
                    if sent is not None:
                        held = len(sent)
                        if smp is not None and len(tokens) == held + 1:
                            sent.append(smp)   # the common row: what it held, and the token it sampled
                            if tokens == sent:
                                sampled_list[i] = smp
                                expect[i] = held
                                continue       # `sent_tokens` is already what its controller will hold
                            sent.pop()
                        expect[i] = held
                        # an edit from the longest prefix it shares with what the controller holds
                        kept = _common_prefix(tokens, sent)
                    else:
                        kept = 0           # nothing recorded (a first call, a fork): C compares from 0
                    fixups.append((i, tokens))   # the whole list, copied once it started
                arr = _suffix_array(tokens, kept, vocab)
                if isinstance(arr, str):   # the engine's mistake; still only this sequence's problem
                    bad.append((seq, f"invalid step input: {arr}"))
                    continue
                edits[i] = (arr, kept)
                if smp is not None:
                    sampled_list[i] = smp
            if bad:   # rare: misuse raises before any of them is finished
                _check_batch(seqs)
                for seq, why in bad:
                    if seq.state is _IDLE:   # a late or finished one: the rows API answers for it
                        seq.finish(why)
            last = runtime.object_rows   # the same sequences as the last batch: the same index array
            if last is not None and last[0] == seqs:
                index = last[1]
            else:
                index = np.array([seq.index for seq in seqs], dtype=np.int64)
                runtime.object_rows = (seqs, index)
            rows = _start_rows(runtime, seqs, items, index, sampled_list, expect, edits, fixups)
        except BaseException:
            _forget_sent(seqs)   # refused: nothing started, the lists are compared from scratch next time
            raise
        self._seqs = seqs
        self._rows = rows
        if fixups or bad or rows.started != n:
            _settle_sent(seqs, rows.scratch.row_status[:n].tolist(), fixups)

    def wait(self, timeout_s: float | None = None) -> BatchOutcome:
        """Collect results (see :meth:`RowsHandle.wait`). Raises ValueError if called twice."""
        masks, _, temps, elapsed, rare, wait_us, blocked_us = self._rows._finish(timeout_s)
        n = len(self._seqs)
        plain = _plain_branches(n)
        if n > 16 and np.isnan(temps).all():   # no controller set a temperature: Branch(i, None) for every row
            branches = plain[:n]
        else:
            branches = [plain[i] if t != t else Branch(i, t) for i, t in enumerate(temps.tolist())]
        results = list(map(mask_result, self._seqs, branches, elapsed.tolist()))
        if rare:
            for i, r in rare.items():
                results[i] = r
        return BatchOutcome(masks, results, wait_us, blocked_us)


_STARTED = int(RowStatus.STARTED)


def _start_rows(runtime: "Runtime", seqs: "list[Sequence]", items: "list[StepInput]", index: np.ndarray,
                sampled: "list[int]", expect: "list[int]", edits: "dict[int, tuple[np.ndarray, int]]",
                fixups: "list[tuple[int, list[int] | None]]") -> RowsHandle:
    """The object API's rows, started through the rows API: one call into the hot path, two when
    some rows turn out stale (the rows API moved those controllers on since the object API's last
    submit: they are compared from scratch)."""
    n = len(sampled)
    both = np.array(sampled + expect, dtype=np.int32)   # one conversion for both (a token count fits: rows.c)
    sampled_arr = both[:n]
    try:
        try:
            return RowsHandle(runtime, index, sampled_arr, edits or None, _object_api=True, _expect_seen=both[n:])
        except _StaleRows as stale:   # nothing started
            for i in stale.rows:
                item = items[i]
                if item.unchanged is None:   # its copy was stale: compare from scratch
                    kept = 0
                    if i not in edits:       # a common row: its copy is replaced once it started
                        fixups.append((i, _as_list(item.tokens)))
                else:                        # the hint's common row: its controller saw another count
                    kept = min(int(item.unchanged), int(seqs[i].slot.n_seen))
                arr = _suffix_array(item.tokens, kept, runtime.vocab_size)
                if isinstance(arr, str):   # a hinted row's tokens before the hint were never checked
                    seqs[i].finish(f"invalid step input: {arr}")
                    continue
                edits[i] = (arr, kept)
            return RowsHandle(runtime, index, sampled_arr, edits or None, _object_api=True)
    except ValueError:
        _check_batch(seqs)   # the hot path refused a row: say so in the same words as ever
        raise


def _check_batch(seqs: "list[Sequence]") -> None:
    """Raise ValueError for the first misuse in a batch of sequences (all of this runtime): one
    still in a batch not waited for, one closed, one submitted twice."""
    running = SeqState.RUNNING
    for seq in seqs:
        state = seq.state
        if state is running:
            raise ValueError(f"sequence {seq.id} is in a batch that has not been waited for")
        if state in _CLOSED:
            raise ValueError(f"sequence {seq.id} is closed")
    if len(set(map(id, seqs))) != len(seqs):
        twice = next(s for k, s in enumerate(seqs) if any(s is t for t in seqs[:k]))
        raise ValueError(f"sequence {twice.id} is submitted twice in one batch")


def _as_list(tokens: "Seq[int]") -> "list[int]":
    """A token list as a Python list of ints (what the object API compares and keeps)."""
    if type(tokens) is list:
        return tokens
    return tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens)


def _forget_sent(seqs: "list[Sequence] | list[Sequence | None]") -> None:
    for seq in seqs:
        if seq is not None:
            seq.sent_tokens = None


def _settle_sent(seqs: "list[Sequence]", status: "list[int]",
                 fixups: "list[tuple[int, list[int] | None]]") -> None:
    """After the submit: what each row's controller now holds, as `Sequence.sent_tokens` (a
    common row's was appended in place). A row not started keeps none (the next submit compares
    from scratch), an edit row a copy of its whole list, a row with an `unchanged` hint none."""
    for i, tokens in fixups:
        seq = seqs[i]
        seq.sent_tokens = list(tokens) if tokens is not None and status[i] == _STARTED else None
    for i, st in enumerate(status):
        if st != _STARTED:
            seqs[i].sent_tokens = None


_plain: list[Branch] = []


def _plain_branches(n: int) -> list[Branch]:
    """Branch(i, None) for i < n, made once: a Branch is immutable, so results share them."""
    while len(_plain) < n:
        _plain.append(Branch(len(_plain), None))
    return _plain
