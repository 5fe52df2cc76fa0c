"""A legal, randomised engine over the runtime's public API, for fuzzing and hostile tests.

Each step submits every live sequence (`Runtime.submit`), waits (sometimes 0 s, so calls come
back late), then applies each result exactly as docs/protocol.md#semantics says: sample a token inside the mask
(which one is the sequence's next choice), apply the first matching splice, fork, no-op or
stop. Between calls the engine may also take tokens back itself (as a host trimming a stop
sequence would), which the controller must see as a net edit.

The engine checks the runtime's side of the contract as it goes and raises :class:`Violation`
for anything illegal it is handed: a mask of the wrong length or with no token, a capability
that was not granted, a backtrack past the start, a controller whose view of the tokens is not
the engine's. A controller's own error (trap, invalid result, time limit) is not a violation:
it finishes that sequence with reason "error" (the fuzzer counts it as a failure).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..capabilities import Capabilities
from ..errors import ControllerError
from ..core.results import StepInput, StepResult, splice_for
from .choices import Choices

if TYPE_CHECKING:
    from ..core.request import Request
    from ..core.results import Branch
    from ..core.runtime import Runtime
    from ..core.sequence import Sequence


class Violation(Exception):
    """The contract was broken at this step; `label` names the sequence."""

    def __init__(self, label: str, message: str):
        super().__init__(f"sequence {label}: {message}")
        self.label, self.message = label, message


@dataclass
class Track:
    """The engine's side of one sequence."""
    label: str
    seq: Any                        # aicirt.Sequence; None when it failed to start
    tokens: list[int]
    prompt_len: int
    choices: Choices
    sampled: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    calls: int = 0                  # results applied
    pending: int = 0                # steps this sequence was late
    last_pending: bool = False
    trace: list[tuple] = field(default_factory=list)   # what each applied result did
    logs: str = ""                  # the controller's log (the last 4 KiB)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]


@dataclass(frozen=True)
class EngineSettings:
    max_tokens: int = 32            # tokens a sequence may append before it ends with "length"
    late_one_in: int = 8            # about one step in this many waits 0 s (late calls)
    backtrack_one_in: int = 12      # after about one result in this many, the engine backtracks
    check_view: bool = True         # compare the runtime's record of the controller's view
    take_var_changes: bool = True   # as an engine streaming them would (False: they pile up)


#: The controller's own view of its tokens after a call, e.g. rebuilt from a variable in which
#: it records every `mid-process-arg` (None: it cannot tell).
View = Callable[[Track], "list[int] | None"]


class FuzzEngine:
    """Drives sequences of one Runtime. `make_choices(label)` gives each new sequence (forks
    included) its stream; `late` decides which steps wait 0 s; `view`, if given, is compared
    after each call with the tokens the engine had submitted."""

    def __init__(self, runtime: Runtime, make_choices: Callable[[str], Choices], late: Choices,
                 settings: EngineSettings = EngineSettings(), view: View | None = None) -> None:
        self.rt = runtime
        self.make_choices = make_choices
        self.late = late
        self.settings = settings
        self.view = view
        self.tracks: list[Track] = []
        self.steps = 0
        self.var_writers: dict[int, set[int]] = {}   # request -> seq-ids that set variables

    # -- sequences -----------------------------------------------------------------------------
    def add(self, request: Request, prompt: list[int], label: str) -> Track:
        """Spawn a sequence of `request`; a controller that fails to start is finished "error"."""
        try:
            seq = request.spawn()
        except ControllerError as e:
            t = Track(label, None, list(prompt), len(prompt), self.make_choices(label))
            t.finish_reason, t.error = "error", str(e)
            self.tracks.append(t)
            return t
        t = Track(label, seq, list(prompt), len(prompt), self.make_choices(label))
        self.tracks.append(t)
        return t

    @property
    def communicating(self) -> bool:
        """Whether some sequence set a variable of a request that has other sequences (forks):
        which of them reads a value first depends on the workers' timing (docs/protocol.md#semantics allows that)."""
        sizes = Counter(id(t.seq.request) for t in self.tracks if t.seq is not None)
        return any(writers and sizes[req] > 1 for req, writers in self.var_writers.items())

    @property
    def live(self) -> list[Track]:
        return [t for t in self.tracks if not t.finished]

    def close(self) -> None:
        for t in self.tracks:
            if t.seq is not None:
                t.seq.close()

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> list[Track]:
        """One engine step; returns the tracks that finished in it. Raises Violation."""
        live = self.live
        if not live:
            return []
        self.steps += 1
        was_late = [t.last_pending for t in live]     # their call from an earlier step is still out
        handle = self.rt.submit([StepInput(t.seq, list(t.tokens), t.sampled) for t in live])
        if self.settings.check_view:
            for t, late in zip(live, was_late):
                seen = getattr(t.seq, "seen", None)
                if not late and seen is not None and not t.seq.finished and list(seen) != t.tokens:
                    raise Violation(t.label, f"the controller was shown {len(seen)} tokens ending "
                                             f"{list(seen)[-5:]}, the engine has {len(t.tokens)} ending {t.tokens[-5:]}")
        outcome = handle.wait(0.0 if self.late.chance(self.settings.late_one_in) else None)
        for req in {id(t.seq.request): t.seq.request for t in live if self.settings.take_var_changes}.values():
            # as an engine streaming variables to its client would: the runtime bounds changes not taken
            self.var_writers.setdefault(id(req), set()).update(c[0] for c in req.take_var_changes())
        if len(outcome.results) != len(live):
            raise Violation("*", f"wait() returned {len(outcome.results)} results for {len(live)} sequences")
        finished = []
        for t, r in zip(live, outcome.results):
            if r.seq is not t.seq:
                raise Violation(t.label, "results came back out of order")
            if self.view is not None and r.status == "ok":
                seen = self.view(t)
                if seen is not None and seen != t.tokens:
                    raise Violation(t.label, f"the controller's own view is {len(seen)} tokens ending {seen[-5:]}, "
                                             f"the engine has {len(t.tokens)} ending {t.tokens[-5:]}")
            self._apply(t, r, outcome.masks)
            if t.finished:
                finished.append(t)
        return finished

    def _finish(self, t: Track, reason: str, error: str | None = None) -> None:
        t.finish_reason, t.error = reason, error
        t.trace.append(("finish", reason))
        t.seq.close()

    def _apply(self, t: Track, r: StepResult, masks: np.ndarray) -> None:
        t.last_pending = r.status == "pending"
        if t.last_pending:
            t.pending += 1
            return
        t.calls += 1
        if r.logs:
            t.logs = (t.logs + r.logs)[-4096:]
        if r.status == "error":
            self._finish(t, "error", r.error or "(no message)")
            return
        if r.status != "ok":
            raise Violation(t.label, f"unknown result status {r.status!r}")
        if not r.branches:
            self._finish(t, "stop")
            return
        caps = t.seq.request.capabilities
        self._check_result(t, r, masks, caps)
        base = list(t.tokens)
        children = [self._fork_track(t, child, base) for child in r.forks]
        for track, branch in zip([t, *children], r.branches):
            self._take_branch(track, branch, base, masks)

    def _fork_track(self, parent: Track, child_seq: Sequence, base: list[int]) -> Track:
        label = f"{parent.label}.{len([x for x in self.tracks if x.label.startswith(parent.label + '.')]) + 1}"
        child = Track(label, child_seq, list(base), parent.prompt_len, self.make_choices(label))
        child.trace.append(("forked-from", parent.label))
        self.tracks.append(child)
        return child

    def _check_result(self, t: Track, r: StepResult, masks: np.ndarray, caps: Capabilities) -> None:
        n = len(r.branches)
        if n > 1 and not caps & Capabilities.FORK:
            raise Violation(t.label, f"a fork into {n} branches was let through without capability `fork`")
        if len(r.forks) != n - 1:
            raise Violation(t.label, f"{n} branches but {len(r.forks)} new sequences")
        vocab = self.rt.vocab_size
        words = (vocab + 31) // 32
        for k, b in enumerate(r.branches):
            if b.temperature is not None and not (math.isfinite(b.temperature) and b.temperature >= 0):
                raise Violation(t.label, f"branch {k}: temperature {b.temperature}")
            if b.mask_row is not None:
                if not 0 <= b.mask_row < len(masks) or masks.shape[1] != words:
                    raise Violation(t.label, f"branch {k}: mask row {b.mask_row} of {masks.shape} (want {words} words)")
                row = masks[b.mask_row]
                if not row.any():
                    raise Violation(t.label, f"branch {k}: mask allows no token")
                if vocab % 32 and int(row[-1]) >> (vocab % 32):
                    raise Violation(t.label, f"branch {k}: mask allows a token >= vocab size {vocab}")
            elif len(b.splices) != 1 or b.splices[0].when_sampled:
                raise Violation(t.label, f"branch {k}: no mask but {len(b.splices)} splices")
            for s in b.splices:
                if s.when_sampled and not caps & Capabilities.CONDITIONAL_FF_TOKENS:
                    raise Violation(t.label, "a conditional splice was let through without `conditional-ff-tokens`")
                if s.backtrack and not caps & Capabilities.BACKTRACK:
                    raise Violation(t.label, "a backtrack was let through without capability `backtrack`")
                if s.ff_tokens and not caps & Capabilities.FF_TOKENS:
                    raise Violation(t.label, "fast-forward tokens were let through without capability `ff-tokens`")
                if any(not 0 <= x < vocab for x in (*s.when_sampled, *s.ff_tokens)):
                    raise Violation(t.label, f"branch {k}: a splice names a token outside the vocabulary")

    def _take_branch(self, t: Track, branch: Branch, base: list[int], masks: np.ndarray) -> None:
        """docs/protocol.md#semantics for one branch applied to `t`, whose tokens were `base` before this step."""
        tokens = list(base)
        splice, sampled = None, None
        if branch.mask_row is not None:
            allowed = np.flatnonzero(np.unpackbits(masks[branch.mask_row].view(np.uint8), bitorder="little"))
            sampled = int(allowed[t.choices.below(len(allowed))])
            tokens.append(sampled)
            splice = splice_for(branch.splices, sampled)
        else:
            splice = branch.splices[0]
        if splice is not None:
            if splice.backtrack > len(tokens):
                raise Violation(t.label, f"a backtrack of {splice.backtrack} past the start ({len(tokens)} tokens) "
                                         "was let through")
            del tokens[len(tokens) - splice.backtrack:]
            tokens.extend(splice.ff_tokens)
        t.tokens, t.sampled = tokens, sampled
        t.trace.append(("result", sampled, None if splice is None else (splice.backtrack, splice.ff_tokens),
                        len(tokens)))
        eos = self.rt.tokenizer.eos_token_id
        if sampled == eos and splice is None:
            self._finish(t, "eos")
        elif len(tokens) - t.prompt_len >= self.settings.max_tokens:
            self._finish(t, "length")
        elif len(tokens) > t.prompt_len and t.choices.chance(self.settings.backtrack_one_in):
            k = 1 + t.choices.below(min(3, len(tokens) - t.prompt_len))
            del t.tokens[-k:]
            t.trace.append(("engine-backtrack", k))
