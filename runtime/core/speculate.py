"""Speculation: the masks a controller would give after each prefix of some draft tokens, with
nothing committed until the host says how many drafts it accepted.

A host with speculative decoding (vLLM's draft rows, the own engine's prompt lookup) proposes k
draft tokens d1..dk after a sequence's last result. To mask the logits row of every draft
position it needs the controller's result *as if* d1..di had been sampled, for each i; to go on
it needs the controller in the state after the accepted prefix d1..da, and no trace of the
rejected rest. :class:`Speculation` gives both, over the rows API:

    spec = Speculation(runtime, index)          # the rows' sequences, idle, each after a mask result
    out = spec.extend(drafts[:, 0])             # one draft a row: its call runs on a copy-fork
    out = spec.extend(drafts[:, 1])             # ...the next, on a fork of that fork
    spec.commit(accepted)                       # each row's sequence becomes its fork after `accepted` drafts
    # (or spec.run(drafts, first_masks) for all k at once)

Each depth's calls are one rows-API batch (they run in parallel on the workers); a row's call
at depth i runs on a copy-fork of its depth-(i-1) state (`Sequence.fork`'s copy, 14 µs a MiB of
changed memory), so the state after every prefix is kept until `commit` picks one. Variables are
kept apart the same way: a row's drafts write to a private copy of its request's variables, and
`commit` sets the request's variables to that copy's values after the accepted prefix (a value
appended to by the controller arrives as one "set" of the whole value in
`Request.take_var_changes`: the values are the same, the operations may differ).

A controller's result for a draft position is exactly what plain stepping gives after those
tokens were sampled: the same state, the same token list, the same random stream (`wasi_rng`),
the same seq-id and fork group. A row's speculation ends at the first draft whose result is not
one mask (a fork, a splice, a no-op, a stop, an error, a call still running after
`Limits.call_timeout_s`); `RowsSpec.ended[i]` says why. Such a result is dropped with the rest:
when plain stepping reaches that token it runs the call again and gets it (controllers are
deterministic). A draft that the previous mask does not allow ends the row too (no call: the
host can never sample it) where the caller passes that mask.

Misuse raises ValueError: a row whose sequence is not idle, has not had its first call, is
finished, or whose request has a call out on another sequence; a second commit; `extend` after
`commit`. Nothing a controller does raises.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..abi import RowKind
from .request import Request
from .sequence import Sequence, SeqState

if TYPE_CHECKING:
    from .results import StepResult
    from .runtime import Runtime

_MASK, _PENDING = int(RowKind.MASK), int(RowKind.PENDING)

#: Why a row's speculation ended (`RowsSpec.ended`, `Speculation.ended`).
ENDED_RESULT = "result"          # its draft's result was not one plain mask: see `Speculation.ended_result`
ENDED_NOT_ALLOWED = "not-allowed"   # the draft is outside the mask before it
ENDED_NO_DRAFT = "no-draft"      # the caller gave no draft (-1) for this depth
ENDED_LATE = "late"              # the call was still running after Limits.call_timeout_s


@dataclass
class RowsSpec:
    """One depth of `Speculation.extend`: per row, `ok[i]` (its draft's call gave one mask:
    `masks[i]`, at `temperature[i]`, NaN: the request's own) or why it ended (`ended[i]`, None
    while it goes on). `masks` is the outcome's own copy."""
    ok: np.ndarray
    masks: np.ndarray
    temperature: np.ndarray
    ended: list[str | None]
    logs: list[str] = field(default_factory=list)
    #: with `extend(go_on=True)`: the rows whose result was not one plain mask, each with its own
    #: mask rows (its branches' `mask_row` index them); those rows go on from that state
    results: dict = field(default_factory=dict)


class _Row:
    """One row's chain: the sequence, its forks after each accepted-so-far draft, their variables."""
    __slots__ = ("seq", "shadow", "chain", "vars_after", "logs", "ended", "ended_result", "ended_fork", "ended_masks",
                 "tokens")

    def __init__(self, seq: Sequence, shadow: Request) -> None:
        self.seq = seq
        self.shadow = shadow
        self.chain: list[Sequence] = []               # chain[i]: the state after drafts[:i + 1]
        self.vars_after: list[dict[str, bytes]] = []  # the variables after each
        self.logs: list[str] = []                      # each draft call's log
        self.ended: str | None = None
        self.ended_result: StepResult | None = None
        self.ended_fork: Sequence | None = None       # the state after the draft whose result ended it
        self.ended_masks: np.ndarray | None = None    # its mask rows (its branches' mask_row index them)
        self.tokens: list[int] = []


def _shadow_request(req: Request) -> Request:
    """A stand-in for `req` that shares everything but the variables: the forks of a speculation
    belong to it, so what their controllers set goes to a private copy (`Request.vars`)."""
    rt = req.runtime
    shadow = Request.__new__(Request)
    shadow.runtime, shadow.controller, shadow.capabilities = rt, req.controller, req.capabilities
    shadow.arg, shadow.arg_buffer = req.arg, req.arg_buffer
    shadow.sequences, shadow.forks = [], req.forks
    shadow.vars = rt.native.new_vars(rt.limits.variable_bytes)
    weakref.finalize(shadow, shadow.vars.close)
    _copy_vars(req.vars.snapshot(), shadow.vars, 0)
    shadow.vars.take_changes()   # the copy has no changes of its own yet
    return shadow


def _copy_vars(values: dict[str, bytes], into: object, seq_id: int, current: dict[str, bytes] | None = None) -> None:
    for name, value in values.items():
        if current is None or current.get(name) != value:
            into.set(seq_id, name, value, False)   # type: ignore[attr-defined]


def _own_masks(r: "StepResult", masks: np.ndarray) -> "tuple[StepResult, np.ndarray | None]":
    """`r` with its branches' mask rows copied out of the batch's array (which the runtime
    reuses) into one of its own, `mask_row` renumbered to index it."""
    import dataclasses
    rows = [b.mask_row for b in r.branches if b.mask_row is not None]
    if not rows:
        return r, None
    own = masks[rows].copy()
    at = {m: k for k, m in enumerate(rows)}
    branches = [b if b.mask_row is None else dataclasses.replace(b, mask_row=at[b.mask_row]) for b in r.branches]
    return dataclasses.replace(r, branches=branches), own


class Speculation:
    """Draft calls for the sequences at `index` (int array of `Sequence.index`), one chain a
    row. Each must be idle, past its first call, not finished, its request with no call out.
    Holds one fork a row and depth until `commit` (or `close`, which commits nothing)."""

    def __init__(self, runtime: "Runtime", index: object) -> None:
        runtime.check_open()
        self.runtime = runtime
        idx = np.asarray(index)
        if idx.dtype.kind not in "iu" or idx.ndim != 1:
            raise TypeError("Speculation takes a 1-d integer array of sequence indices")
        self.index = idx.astype(np.int64)
        reg = runtime.registry
        reg.ptrs(self.index)   # raises for an index that is no live sequence
        if len(np.unique(self.index)) != len(self.index):
            raise ValueError("a sequence is in one speculation twice")
        self._rows: list[_Row] = []
        for i in self.index.tolist():
            seq = reg.at(i)
            state = seq.state
            if state is not SeqState.IDLE:
                raise ValueError(f"sequence {seq.id} is {state.value}: only an idle sequence can speculate")
            if seq.calls < 1:
                raise ValueError(f"sequence {seq.id} has not had its first call: there is no mask to speculate after")
            req = seq.request
            if any(s.call_out for s in req.sequences):
                raise ValueError(f"sequence {seq.id}: its request has a call out (variables would race)")
            self._rows.append(_Row(seq, _shadow_request(req)))
        self._done = False
        self.depth = 0

    def __len__(self) -> int:
        return len(self._rows)

    def __enter__(self) -> "Speculation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- drafts -------------------------------------------------------------------------------------
    def extend(self, tokens: object, allowed: np.ndarray | None = None,
               edits: "dict[int, tuple[list[int], int]] | None" = None, skip: "set[int] | None" = None,
               go_on: bool = False) -> RowsSpec:
        """The next draft token of each row (int array; -1: none, which ends that row): its call
        runs on a fork of the row's state after the drafts so far. `allowed`: the masks the
        drafts are sampled under (uint32 [rows, words]): a draft they do not allow ends its row
        without a call. Rows already ended stay ended (their `ok` is False). Raises ValueError
        after `commit`, TypeError / ValueError for a bad array.

        `edits` {row: (tokens past the first `kept`, kept)}: that row's call gets an edit, as a
        rows-API row does (a host that appended forced tokens calls its controller so), with
        `tokens[row]` as its sampled token (-1: none); its depth counts as one in `commit`.
        `skip`: rows that make no call at this depth and go on (a host forcing a token there).
        `go_on`: a result that is not one plain mask (a splice, a stop, an error; not a fork or a
        late call) does not end its row: it is in `RowsSpec.results` and the row's state after it
        counts as a depth, for a host that simulates what it does with it."""
        edits, skip = edits or {}, skip or set()
        if self._done:
            raise ValueError("this speculation was committed")
        toks = np.asarray(tokens)
        n, rt = len(self._rows), self.runtime
        if toks.ndim != 1 or len(toks) != n or (n and toks.dtype.kind not in "iu"):
            raise TypeError(f"extend takes one integer draft token a row ({n} rows)")
        toks = toks.astype(np.int64)
        words = rt.mask_words
        masks = np.zeros((n, words), dtype=np.uint32)
        temperature = np.full(n, np.nan, dtype=np.float32)
        ok = np.zeros(n, dtype=bool)
        ended: list[str | None] = [row.ended for row in self._rows]
        logs = [""] * n
        results: dict = {}
        self.depth += 1
        go: list[int] = []
        forks: list[Sequence] = []
        for i, row in enumerate(self._rows):
            if row.ended is not None or i in skip:
                continue
            t = int(toks[i])
            why = None
            if t < 0 and i not in edits:
                why = ENDED_NO_DRAFT
            elif t >= rt.vocab_size:
                raise ValueError(f"draft token {t} of row {i} is outside the vocabulary (0..{rt.vocab_size - 1})")
            elif allowed is not None and i not in edits and not (int(allowed[i, t >> 5]) >> (t & 31)) & 1:
                why = ENDED_NOT_ALLOWED
            if why is None:
                parent = row.chain[-1] if row.chain else row.seq
                try:
                    fork = parent.draft_copy(row.shadow, row.seq)
                except Exception as e:   # no free instance slot: this row speculates no further
                    row.ended, row.ended_result = ENDED_RESULT, None
                    ended[i] = f"{ENDED_RESULT}: {e}"
                    continue
                row.chain.append(fork)
                row.tokens.append(t)
                go.append(i)
                forks.append(fork)
            else:
                row.ended = ended[i] = why
        if go:
            handle = rt.submit_rows(np.fromiter((f.index for f in forks), np.int64, len(forks)),
                                    toks[go].astype(np.int32),
                                    {j: edits[i] for j, i in enumerate(go) if i in edits} or None)
            out = handle.wait(timeout_s=rt.limits.call_timeout_s + 0.1)
            taken = np.asarray(go)
            is_mask = out.kind[:len(go)] == _MASK
            masks[taken[is_mask]] = out.masks[:len(go)][is_mask]
            temperature[taken[is_mask]] = out.temperature[:len(go)][is_mask]
            ok[taken[is_mask]] = True
            for j in np.flatnonzero(~is_mask).tolist():
                i, row = go[j], self._rows[go[j]]
                r = out.results[j]
                logs[i] = r.logs or ""
                b = r.branches[0] if r.status == "ok" and len(r.branches) == 1 and not r.forks else None
                if b is not None and b.mask_row is not None and not b.splices:
                    masks[i] = out.masks[b.mask_row]   # one mask, with a log line: it goes on
                    temperature[i] = np.nan if b.temperature is None else b.temperature
                    ok[i] = True
                    continue
                if go_on and r.status != "pending" and not r.forks:
                    results[i] = _own_masks(r, out.masks)
                    row.vars_after.append(row.shadow.vars.snapshot())
                    row.logs.append(r.logs or "")
                    continue
                row.ended = ended[i] = ENDED_LATE if r.status == "pending" else ENDED_RESULT
                row.ended_result, row.ended_masks = _own_masks(r, out.masks)
                fork = row.chain.pop()
                row.tokens.pop()
                if r.status == "pending":
                    fork.close()
                else:   # kept: a host may accept that draft too and then apply this result itself
                    row.ended_fork = fork
                    row.vars_after.append(row.shadow.vars.snapshot())
                    row.logs.append(r.logs or "")
            for i in np.asarray(go)[ok[go]].tolist():
                row = self._rows[i]
                row.vars_after.append(row.shadow.vars.snapshot())
                row.logs.append(logs[i])
        return RowsSpec(ok, masks, temperature, ended, logs, results)

    def run(self, drafts: object, first_masks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All the drafts at once: `drafts` int [rows, k] (-1 pads a shorter row). Returns
        (`n_ok` [rows]: the drafts each row has a mask after, `masks` uint32 [rows, k, words]:
        masks[i, j] the mask after drafts[i, :j + 1], `temperature` [rows, k]). `first_masks`:
        each row's current mask (what the first draft is sampled under), so that a draft outside
        its mask ends the row without a call."""
        d = np.asarray(drafts)
        if d.ndim != 2 or d.shape[0] != len(self._rows):
            raise TypeError(f"run takes drafts of shape [rows, k] ({len(self._rows)} rows)")
        n, k = d.shape
        masks = np.zeros((n, k, self.runtime.mask_words), dtype=np.uint32)
        temps = np.full((n, k), np.nan, dtype=np.float32)
        n_ok = np.zeros(n, dtype=np.int64)
        allowed = first_masks
        for j in range(k):
            if all(row.ended is not None for row in self._rows):
                break
            step = self.extend(d[:, j], allowed)
            masks[:, j] = step.masks
            temps[:, j] = step.temperature
            n_ok += step.ok
            allowed = masks[:, j] if first_masks is not None else None
        return n_ok, masks, temps

    @property
    def drafted(self) -> list[list[int]]:
        """Each row's drafts that have a mask after them (the ones `commit` may accept)."""
        return [list(row.tokens) for row in self._rows]

    def ended_result(self, row: int) -> "StepResult | None":
        """The result that ended row `row`'s speculation, when a draft's call did. A host that
        accepts that draft too commits `len(drafted[row]) + 1` and applies this result itself
        (docs/protocol.md#semantics); otherwise it is dropped, and plain stepping makes it again."""
        return self._rows[row].ended_result

    def ended(self, row: int) -> str | None:
        """Why row `row`'s speculation ended (ENDED_*), None while it goes on."""
        return self._rows[row].ended

    def ended_masks(self, row: int) -> np.ndarray | None:
        """The mask rows of `ended_result(row)` (its branches' `mask_row` index them)."""
        return self._rows[row].ended_masks

    def draft_logs(self, row: int) -> list[str]:
        """The log of each of row `row`'s draft calls (`drafted`, then the one that ended it)."""
        return list(self._rows[row].logs)

    # -- the end -----------------------------------------------------------------------------------
    def commit(self, accepted: object) -> None:
        """Each row's sequence goes on from its state after its first `accepted[i]` drafts (0:
        as before the speculation; at most `len(drafted[i])`, or one more where a result ended
        the row: `ended_result`, which the host then applies); every other fork is closed. The
        row's next call is then a plain step (the token sampled after the accepted drafts).
        Raises ValueError for a count out of range or a second commit (nothing is changed)."""
        if self._done:
            raise ValueError("this speculation was already committed")
        acc = np.asarray(accepted)
        if acc.shape != (len(self._rows),) or (len(acc) and acc.dtype.kind not in "iu"):
            raise TypeError(f"commit takes one accepted count a row ({len(self._rows)} rows)")
        for i, (a, row) in enumerate(zip(acc.tolist(), self._rows)):
            if not 0 <= a <= len(row.chain) + (row.ended_fork is not None):
                raise ValueError(f"row {i}: accepted {a} of {len(row.chain)} drafts with a mask")
            if a and row.seq.state is not SeqState.IDLE:
                raise ValueError(f"row {i}: sequence {row.seq.id} is {row.seq.state.value} (closed meanwhile?)")
        self._done = True
        native = self.runtime.native
        for a, row in zip(acc.tolist(), self._rows):
            if a:
                seq, req = row.seq, row.seq.request
                take = row.chain[a - 1] if a <= len(row.chain) else row.ended_fork
                assert take is not None   # checked above: past the chain only with an ended fork
                old_log = seq.take_state_of(take, req)
                spec_log = b"".join(native.log_bytes(f.slot) for f in row.chain[:a - 1]) + native.log_bytes(seq.slot)
                took_ended = row.ended_fork is take      # (apart: `is` would widen take to Optional)
                if took_ended and take.finished:        # its stop or error carries over
                    seq.finish(take.error)
                if spec_log:
                    slot = seq.slot
                    slot.log_len = 0
                    native.log_append(slot, bytes(old_log) + spec_log)
                    slot.call_log_len = 0
                _copy_vars(row.vars_after[a - 1], req.vars, seq.id, req.vars.snapshot())
            self._close_row(row)

    def close(self) -> None:
        """Drop every draft (commit 0 for each row); idempotent."""
        if not self._done:
            self.commit(np.zeros(len(self._rows), dtype=np.int64))

    @staticmethod
    def _close_row(row: _Row) -> None:
        for s in row.shadow.sequences:
            s.close()
        row.shadow.sequences.clear()
        row.chain.clear()
