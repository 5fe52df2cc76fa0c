"""Applying one step's outcome to the sequences (docs/protocol.md#semantics): mask, sample, splice, fork, stop.

The engine decides what runs and when; this module only turns each controller's result (and,
for plain sequences, the logits) into edits of `GenSeq.tokens` and the caches, keeping the
engine's invariant that every cache holds a prefix of its sequence's tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..abi import RowKind
from ..core.batch import RowsOutcome
from ..core.results import Splice, StepResult, splice_for
from .backends.base import Backend
from .sampling import apply_masks, find_stop, forced_logprob, sample, token_logprobs
from .types import Event, FinishEvent, ForkEvent, GenSeq, LogEvent, TokensEvent


@dataclass
class _Draw:
    """One branch to sample this step: which sequence, its logits, mask (a row of the batch's
    masks; None: unmasked) and temperature."""
    seq: GenSeq
    logits: np.ndarray
    mask: np.ndarray | None
    temperature: float
    splices: tuple = ()
    token: int = -1
    error: str | None = field(default=None)
    logprob: tuple | None = None           # with params.logprobs: the token's `sampling.TokenLogprob`


def _logits(s: GenSeq) -> np.ndarray:
    if s.logits is None:   # every live sequence has them once the step's forward pass is done
        raise RuntimeError(f"engine bug: sequence {s.label} of request {s.request.id} has no logits")
    return s.logits


class Applier:
    """Applies step outcomes over one backend (which forks, crops and frees the caches)."""

    def __init__(self, backend: Backend):
        self.backend = backend

    def apply(self, live: list[GenSeq], controlled: list[GenSeq], outcome: RowsOutcome | None, mask_vocab: int,
              events: list[Event]) -> None:
        """Mask, sample, splice, fork and stop, as each controller's result says (docs/protocol.md#semantics).

        `controlled` are the sequences of `live` with a controller, in the order of the
        outcome's rows; `mask_vocab` is the width the masks cover (the runtime's vocabulary)."""
        draws: list[_Draw] = []
        for s in live:
            if s.ctrl is None:
                s.sampled = None
                draws.append(_Draw(s, _logits(s), None, s.request.params.temperature))
        if outcome is not None:
            masks, kind, temperature, elapsed = outcome.masks, outcome.kind, outcome.temperature, outcome.elapsed_us
            for i, s in enumerate(controlled):
                k = kind[i]
                if k == RowKind.MASK:    # the common row: sample under its mask
                    s.controller_us += elapsed[i]
                    t = temperature[i]
                    draws.append(_Draw(s, _logits(s), masks[i], s.request.params.temperature if t != t else float(t)))
                elif k == RowKind.OTHER:
                    self._plan(s, outcome.results[i], masks, draws, events)
        self._sample(draws, mask_vocab)
        for d in draws:
            self._commit(d, events)

    def _plan(self, s: GenSeq, r: StepResult, masks: np.ndarray, draws: list[_Draw], events: list[Event]) -> None:
        """Turn one controller result into draws (sampling) or direct edits."""
        s.controller_us += r.elapsed_us
        if r.logs:
            s.logs.append(r.logs)
            events.append(LogEvent(s.request, s, r.logs))
        if r.status == "pending":
            return  # late: no-op this step; its result comes with a later one
        if r.status == "error":
            self.finish(s, "error", r.error, events)
            return
        if not r.branches:
            self.finish(s, "stop", None, events)
            return
        # Forks first: every branch starts from the tokens and logits this step began with.
        targets = [s, *self.fork(s, r.forks, events)]
        temperature = s.request.params.temperature
        for target, branch in zip(targets, r.branches):
            if branch.mask_row is None:
                self._splice(target, branch.splices[0], events)
            else:
                t = temperature if branch.temperature is None else branch.temperature
                draws.append(_Draw(target, _logits(target), masks[branch.mask_row], t, branch.splices))

    def _sample(self, draws: list[_Draw], mask_vocab: int) -> None:
        """Mask (one vectorised pass over all masked draws), then sample each draw."""
        if not draws:
            return
        v = self.backend.vocab_size
        masked = [d for d in draws if d.mask is not None]
        if masked:
            logits = np.stack([d.logits for d in masked]).astype(np.float32, copy=True)
            rows = np.stack([d.mask for d in draws if d.mask is not None])
            apply_masks(logits[:, :min(v, mask_vocab)], rows)
            if v > mask_vocab:  # logit columns the tokenizer (and so the mask) does not cover
                logits[:, mask_vocab:] = -np.inf
            for d, row in zip(masked, logits):
                d.logits = row
        for d in draws:
            params = d.seq.request.params
            try:
                d.token = sample(d.logits, d.temperature, d.seq.request.rng, params.top_k, params.top_p)
            except ValueError as e:
                d.error = str(e)
                continue
            if params.logprobs is not None:
                d.logprob = token_logprobs(d.logits, d.token, params.logprobs)

    def _commit(self, d: _Draw, events: list[Event]) -> None:
        s = d.seq
        if d.error is not None:
            self.finish(s, "error", d.error, events)
            return
        s.tokens.append(d.token)
        if d.logprob is not None and len(s.tokens) > len(s.request.prompt):
            s.logprobs.append(d.logprob)
        s.sampled = d.token
        s.logits = None
        s.generated += 1
        s.idle_steps = 0
        # The client sees the sampled token even when a splice takes it back at once, so a
        # replaced token shows as a visible backtrack.
        events.append(TokensEvent(s.request, s, 0, [d.token]))
        splice = splice_for(d.splices, d.token)
        if splice is not None and (splice.backtrack or splice.ff_tokens):
            self._splice(s, splice, events)
        elif d.token == self.backend.eos_token_id and not s.request.params.ignore_eos:
            self.finish(s, "eos", None, events)
        elif not self._check_stop(s, events, 1):
            self._check_length(s, events)

    def _splice(self, s: GenSeq, splice: Splice, events: list[Event]) -> None:
        """Backtrack then fast-forward; (0, []) is a no-op step."""
        if splice.backtrack == 0 and not splice.ff_tokens:
            s.idle_steps += 1
            if s.idle_steps >= s.request.params.max_idle_steps:
                self.finish(s, "error", f"no-op for {s.idle_steps} steps in a row", events)
            return
        s.idle_steps = 0
        if splice.backtrack > len(s.tokens):
            self.finish(s, "error", f"backtrack {splice.backtrack} reaches past the start of the sequence "
                                     f"({len(s.tokens)} tokens)", events)
            return
        keep = len(s.tokens) - splice.backtrack
        # max_tokens bounds forced text too: a fast-forward past the budget is cut there ("length")
        ff = list(splice.ff_tokens)[:max(0, s.request.params.max_tokens - s.generated)]
        del s.tokens[keep:]
        s.unchanged = min(s.unchanged, keep)
        s.tokens.extend(ff)
        top = s.request.params.logprobs
        if top is not None:
            start = len(s.request.prompt)
            del s.logprobs[max(0, keep - start):]
            s.logprobs.extend(forced_logprob(t, top) for t in s.tokens[max(keep, start):])
        if s.cache.length > keep:
            self.backend.backtrack(s.cache, keep)
        s.logits = None
        s.generated += len(ff)
        events.append(TokensEvent(s.request, s, splice.backtrack, ff))
        if not s.tokens:
            self.finish(s, "error", "a splice left the sequence empty", events)
            return
        if not self._check_stop(s, events, len(ff)):
            self._check_length(s, events)

    def _check_stop(self, s: GenSeq, events: list[Event], appended: int) -> bool:
        """End `s` ("stop") if its output text holds one of its stop strings, its text cut before
        the first; True if it did. `appended`: tokens added since the last check. Only the text a
        stop ending in them can span is decoded (token bytes concatenate), so a step costs the
        stop's length, not the output's."""
        stops = s.request.params.stop
        if not stops:
            return False
        out = s.output_tokens
        need = max(len(x.encode("utf-8")) for x in stops) - 1     # bytes a stop may reach back
        new = self.backend.decode_bytes(out[len(out) - appended:]) if appended else b""
        k = min(len(out), appended + need)
        tail = self.backend.decode_bytes(out[len(out) - k:])
        while k < len(out) and len(tail) - len(new) < need:      # tokens of no bytes: look further back
            k = min(len(out), 2 * k + 1)
            tail = self.backend.decode_bytes(out[len(out) - k:])
        at = find_stop(tail, stops)
        if at is None:
            return False
        head = self.backend.decode_bytes(out[:len(out) - k])
        self.finish(s, "stop", None, events)
        s.text_bytes = (head + tail)[:len(head) + at]
        return True

    def _check_length(self, s: GenSeq, events: list[Event]) -> None:
        if s.generated >= s.request.params.max_tokens:
            self.finish(s, "length", None, events)

    def fork(self, s: GenSeq, ctrls: list, events: list[Event]) -> list[GenSeq]:
        """A child of `s` for each controller in `ctrls` (a fork's new sequences): the tokens, cache
        (forked), logits and counters `s` began this step with; each added to the request, a
        ForkEvent each."""
        children = []
        for child_ctrl in ctrls:
            child = GenSeq(s.request, label=len(s.request.sequences), tokens=list(s.tokens),
                           cache=self.backend.fork(s.cache), ctrl=child_ctrl, logits=s.logits,
                           generated=s.generated, parent=s.label, unchanged=s.unchanged, synced=s.synced,
                           logprobs=list(s.logprobs))
            s.request.sequences.append(child)
            children.append(child)
            events.append(ForkEvent(s.request, s, child))
        return children

    def finish(self, s: GenSeq, reason: str, error: str | None, events: list[Event]) -> None:
        """End `s`: record why, keep its text, free its cache and controller; a FinishEvent."""
        s.finish_reason, s.error = reason, error
        s.logits = None
        s.text_bytes = self.backend.decode_bytes(s.output_tokens)
        self.backend.free(s.cache)
        if s.ctrl is not None:
            s.ctrl.close()
        events.append(FinishEvent(s.request, s, reason, error))
