"""Controllers under a host that appends exactly one token per step and can only mask logits.

This is the engine-independent core of the vLLM adapter (numpy only, no torch, no vLLM), so a
layer for another engine or for vLLM's Model Runner V2 is a thin mapping of batch rows.

A step, for every controlled request in the host's batch:

    steering.begin(batch)        # before the forward pass: controllers start on worker threads
    ...forward pass...
    plan = steering.end()        # wait, then one mask row per request (plan.masks[i] for batch[i])
    ...host masks logits row i with plan.masks[i] (temperature plan.temperatures[i]) and samples...

docs/protocol.md#hosts, "vLLM (logits processor)": the controller is granted only what such a host can honour,
MASK_ONLY_CAPABILITIES (ff-tokens, conditional ff-tokens; no backtrack, no fork):
- a mask is applied as is; a branch temperature is passed on in `plan.temperatures` for the host to
  apply where it can do so exactly;
- fast-forward tokens are forced one a step (a mask of one token) while the controller is held (not
  called); its next call then reports them, with the sampled token, as one net edit, exactly as
  under a host that appends them at once (the runtime derives the edit from the token list);
- stop forces EOS; a controller error forces the text `[aicirt error: ...]` and then EOS (so the
  user sees why in the request's output), and is logged on logger ``aicirt.integrations``;
- a late controller cannot no-op a step (the host samples every row): `end` waits for it, in rounds
  of `Limits.call_timeout_s` (the time one call may run before epoch interruption ends it), and the
  runtime fails it after `Limits.max_late_steps` rounds without an answer (a host import, e.g. the
  first `token-trie` on a busy machine, is not interrupted); an explicit no-op result is asked
  again at once (nothing else can change while the host waits), up to MAX_NOOPS times;
- a step in which the host appended nothing for a planned row (it discarded the sample, as vLLM
  does for a chunked prefill's partial chunks) is planned again the same way, without a call.
"""
from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..abi import RowKind
from ..capabilities import Capabilities
from ..errors import AicirtError, failure_message
from ..core.batch import row_edit
from ..core.results import StepResult, splice_for

if TYPE_CHECKING:
    from ..core.batch import RowsHandle

log = logging.getLogger("aicirt.integrations")

#: What a host that masks one token per step can honour (docs/protocol.md#hosts).
MASK_ONLY_CAPABILITIES = Capabilities.FF_TOKENS | Capabilities.CONDITIONAL_FF_TOKENS

#: Consecutive no-op results asked again within one step before the request fails.
MAX_NOOPS = 64

#: The request's output gets this text (its message cut to ERROR_TEXT_BYTES) before EOS.
ERROR_TEXT = "\n[aicirt error: {}]"
ERROR_TEXT_BYTES = 240

_SAMPLE, _FORCE = "sample", "force"
_MASK, _PENDING = int(RowKind.MASK), int(RowKind.PENDING)   # (an enum member's lookup costs µs a row)


@dataclass
class StepPlan:
    """What the host applies this step: `masks[i]` (uint32 words, xgrammar's/AICI's bit layout,
    ceil(V/32) per row) and `temperatures[i]` (None: the request's own) for the i-th request
    passed to `Steering.begin`. A forced token is a mask with one bit set."""
    masks: np.ndarray
    temperatures: list[float | None]


class Steered:
    """One request's controller and its state machine; made by :meth:`Steering.open`.

    `output` is the host's list of generated tokens for this request, read (never written) at
    each `begin`; the host must append exactly one token per step. `error` is set once the
    controller failed; `finished` once it stopped or failed (the host is then forced to EOS).
    """

    def __init__(self, steering: "Steering", controller: Any, arg: bytes | str, prompt: Sequence[int],
                 output: list[int], label: str) -> None:
        self.label = label
        self.output = output
        self.tokens = [*prompt, *output]          # everything the controller's view is derived from
        self.error: str | None = None
        self.stopped = False
        self._steering = steering
        self._observed = len(output)
        self._expect: str | None = None           # what the last plan makes the host append
        self._forced_token = -1
        self._forced: deque[int] = deque()
        self._splices: tuple = ()
        self._report_sampled: int | None = None   # `sampled` for the controller's next call
        self._submitted_len: int | None = None
        self._temperature: float | None = None
        self._last_mask: np.ndarray | None = None
        self._replay = False
        self._first = True                        # the next result is the first call's
        self.seq = self.request = None
        self._closed = False
        if isinstance(controller, str):   # the controller could not be had: this message says why
            self._fail(controller)
            return
        self.request = steering.runtime.new_request(controller, arg, MASK_ONLY_CAPABILITIES)
        try:
            self.seq = self.request.spawn()
        except AicirtError as e:
            self._fail(str(e))

    @property
    def finished(self) -> bool:
        return self.stopped or self.error is not None

    @property
    def variables(self) -> dict[str, bytes]:
        return dict(self.request.variables) if self.request is not None else {}

    # -- before the forward pass ---------------------------------------------------------------
    def _observe(self) -> None:
        """Take in what the host appended since the last step and check it is what was planned."""
        appended = self.output[self._observed:]
        self._observed = len(self.output)
        self.tokens.extend(appended)
        expect, self._expect = self._expect, None
        if self.finished:
            return
        if expect is not None and not appended:
            # The host discarded this row's sample (a chunked prefill's partial chunk): plan it again.
            self._expect, self._replay = expect, True
            return
        if len(appended) != (expect is not None):
            self._fail(f"the host appended {len(appended)} tokens in one step where "
                       f"{int(expect is not None)} was planned (speculative decoding and async scheduling "
                       f"are not supported)")
            return
        if expect == _FORCE and appended[0] != self._forced_token:
            self._fail(f"the host appended token {appended[0]} where token {self._forced_token} was forced "
                       f"(another logits processor overrode the mask?)")
        elif expect == _SAMPLE:
            token = appended[0]
            self._report_sampled = token
            splice = splice_for(self._splices, token)
            if splice is not None:   # backtrack is 0: the capability is not granted
                self._forced.extend(splice.ff_tokens)

    def _begin(self) -> tuple[int, int, tuple[list[int], int] | None] | None:
        """The controller's call for this step as a row of the runtime's rows API (its index, the
        sampled token or -1, and its edit when the tokens changed otherwise than by appending
        it: the prompt, forced tokens), or None while it is held or finished."""
        out = self.output
        if (self._expect is _SAMPLE and not self._splices and len(out) == self._observed + 1
                and len(self.tokens) == self._submitted_len and not self.finished):
            # The common row: it sampled under a mask with no splice, and the host appended that one
            # token. What `_observe` and `row_edit` would conclude (no edit), without their work.
            token = out[-1]
            self._observed += 1
            self.tokens.append(token)
            self._submitted_len += 1
            self._expect = None
            return self.seq.index, token, None  # type: ignore[union-attr]  # spawned
        self._observe()
        if self.finished or self._forced or self._replay:
            return None
        synced, self._submitted_len = self._submitted_len, len(self.tokens)
        sampled, self._report_sampled = self._report_sampled, None
        # the first call gets the whole list; a later one only what changed since the last
        edit = (self.tokens, 0) if synced is None else row_edit(self.tokens, sampled, synced, synced)
        return self.seq.index, -1 if sampled is None else sampled, edit  # type: ignore[union-attr]  # spawned

    def _take_mask(self, temperature: float, masks: np.ndarray, pos: int) -> None:
        """The common result (one branch, a mask) as the rows API returns it, its mask already
        copied into `masks[pos]` (with the batch's others, by one copy): sample under it."""
        self._first = False
        self._last_mask = masks[pos]
        self._temperature = None if temperature != temperature else temperature   # NaN: none
        self._splices = ()
        self._expect = _SAMPLE

    # -- after the forward pass ----------------------------------------------------------------
    def _take(self, r: StepResult, masks: np.ndarray, row: np.ndarray) -> bool:
        """Apply one result; True when there is none yet (late: wait again) or it was a no-op (ask
        again)."""
        if r.logs:
            for line in r.logs.rstrip("\n").split("\n"):
                log.debug("%s log: %s", self.label, line)
        if r.status == "pending":
            return True   # wait another round (the runtime fails it after Limits.max_late_steps)
        first, self._first = self._first, False
        if r.status == "error":
            self._fail(failure_message(r.error or "controller error", r.logs))
        elif not r.branches:
            if first and not self.output and r.logs.strip():
                # stopped before producing anything, saying why: it refused its argument
                self._fail(failure_message("it stopped on its first call", r.logs))
            else:
                self.stopped = True
        else:
            b = r.branches[0]    # one branch: fork is not granted, so the runtime refused more
            if b.mask_row is None:
                if b.is_noop:
                    return True
                self._forced.extend(b.splices[0].ff_tokens)   # backtrack is 0: not granted
            else:
                row[:] = masks[b.mask_row]
                self._last_mask = row
                self._temperature = b.temperature
                self._splices = b.splices
                self._expect = _SAMPLE
        return False

    def _plan(self, masks: np.ndarray, pos: int) -> float | None:
        """This step's row `masks[pos]`: the controller's mask (already there), a forced token, or EOS."""
        replay, self._replay = self._replay, False
        if self._expect == _SAMPLE:
            if replay:
                masks[pos] = self._last_mask
            return self._temperature
        if replay:
            token = self._forced_token
        elif self._forced:
            token = self._forced.popleft()
        elif self.finished:
            token = self._steering.eos_token_id
        else:
            return None   # unreachable: every live, unheld controller was asked this step
        if not self.finished:
            self._expect, self._forced_token = _FORCE, token
        row = masks[pos]
        row[:] = 0
        row[token >> 5] = np.uint32(1 << (token & 31))
        return None

    def _fail(self, message: str) -> None:
        if self.finished:
            return
        self.error = message
        log.warning("%s: controller error, request ended: %s", self.label, message)
        text = message.encode("utf-8")[:ERROR_TEXT_BYTES].decode("utf-8", "ignore")
        self._forced = deque(self._steering.error_tokens(text))
        self._expect = None

    def close(self) -> None:
        """Free the controller. Idempotent."""
        self._closed = True
        if self.request is not None:
            self.request.close()


class Steering:
    """Runs the controllers of one host's batch through `runtime` (an :class:`aicirt.Runtime` over
    the host model's tokenizer); `eos_token_id` is the token the host stops on.

    `error_text`: force the error message into a failed request's output (else only EOS).
    Misuse (`end` without `begin`, a closed request in the batch) raises ValueError.
    """

    def __init__(self, runtime: Any, eos_token_id: int, *, error_text: bool = True) -> None:
        if not 0 <= eos_token_id < runtime.vocab_size:
            raise ValueError(f"eos_token_id {eos_token_id} is outside the vocabulary (size {runtime.vocab_size})")
        self.runtime = runtime
        self.eos_token_id = int(eos_token_id)
        self.error_text = error_text
        self._batch: list[Steered] | None = None
        self._handle: RowsHandle | None = None
        self._asked: list[Steered] = []
        self._asked_at: list[int] = []   # their positions in the batch
        self._count = 0

    def open(self, controller: Any, arg: bytes | str, prompt: Sequence[int], output: list[int],
             label: str | None = None) -> Steered:
        """Start a controlled request. `controller`: an :class:`aicirt.Controller` (see
        `Runtime.load`), or a message saying why there is none (the request then fails at once,
        as does one whose controller cannot start)."""
        self._count += 1
        name = controller if isinstance(controller, str) else controller.name
        return Steered(self, controller, arg, prompt, output, label or f"aicirt#{self._count} ({name[:40]})")

    def error_tokens(self, message: str) -> list[int]:
        if not self.error_text:
            return []
        return list(self.runtime.tokenizer.encode(ERROR_TEXT.format(message)))

    @property
    def pending(self) -> bool:
        """Whether a `begin` has not been ended yet."""
        return self._batch is not None

    def begin(self, batch: Sequence[Steered]) -> None:
        """Before the forward pass: start the controllers of `batch` that are not held."""
        if any(s._closed for s in batch):
            raise ValueError("a closed request is in the batch")
        if self._batch is not None:
            # The host skipped the step after the last begin (nothing sampled): take those results
            # now; each request then sees nothing appended and replays that plan.
            self.end()
        self._batch = list(batch)
        asked: list[Steered] = []
        at: list[int] = []
        index: list[int] = []
        sampled: list[int] = []
        edits: dict[int, tuple[list[int], int]] = {}
        for pos, s in enumerate(self._batch):
            row = s._begin()
            if row is not None:
                if row[2] is not None:
                    edits[len(asked)] = row[2]
                asked.append(s)
                at.append(pos)
                index.append(row[0])
                sampled.append(row[1])
        self._asked, self._asked_at = asked, at
        self._handle = self.runtime.submit_rows(np.array(index, dtype=np.int64), np.array(sampled, dtype=np.int32),
                                                edits or None) if asked else None

    def end(self) -> StepPlan:
        """After the forward pass: wait for the controllers (up to the hard limit) and plan.

        The common rows (a mask back) cost no Python object: their masks go into the plan's
        matrix by one vectorised copy, their state by a few attribute writes each."""
        if self._batch is None:
            raise ValueError("Steering.end() without begin()")
        batch, self._batch = self._batch, None
        asked, at = self._asked, self._asked_at
        handle, self._handle = self._handle, None
        wait_s = self.runtime.limits.call_timeout_s + 0.1
        n = len(batch)
        out = handle.wait(timeout_s=wait_s) if handle is not None else None
        if out is not None and len(asked) == n and not out.results:   # every row a MASK (results: the others)
            return self._all_masks(asked, out.masks[:n].copy(), out.temperature.tolist())
        masks = np.zeros((n, self.runtime.mask_words), dtype=np.uint32)
        for _ in range(MAX_NOOPS + 1):
            if out is None:
                break
            is_mask = out.kind == _MASK
            taken = np.flatnonzero(is_mask)
            if len(taken):
                masks[np.asarray(at)[taken]] = out.masks[taken]
            again, again_at = [], []
            if len(taken) < len(asked):
                kinds = out.kind.tolist()
                for i, s in enumerate(asked):
                    if kinds[i] == _MASK:
                        continue
                    if kinds[i] == _PENDING or s._take(out.results[i], out.masks, masks[at[i]]):
                        again.append(s)   # late: wait again (the runtime fails it after Limits.max_late_steps); no-op: ask again
                        again_at.append(at[i])
            temperature = out.temperature.tolist()
            for i in taken.tolist():
                asked[i]._take_mask(temperature[i], masks, at[i])
            asked, at = again, again_at
            handle = self.runtime.submit_rows(np.array([s.seq.index for s in asked], dtype=np.int64),  # type: ignore[union-attr]
                                              np.full(len(asked), -1, dtype=np.int32)) if asked else None
            out = handle.wait(timeout_s=wait_s) if handle is not None else None
        if out is not None:   # still no answer, or no-op, after MAX_NOOPS rounds
            for i, s in enumerate(asked):
                r = out.results.get(i)
                s._fail(r.error or "controller error" if r is not None and r.status == "error" else
                        f"no answer after {MAX_NOOPS + 1} rounds (late or no-op each time): this host samples "
                        f"a token every step, so a controller cannot wait")
        temperatures = [s._plan(masks, pos) for pos, s in enumerate(batch)]
        self._log_variables(batch)
        return StepPlan(masks, temperatures)

    def _all_masks(self, batch: list[Steered], masks: np.ndarray, temperature: list[float]) -> StepPlan:
        """The common step: every request of the batch was asked, in order, and each came back
        with a mask (`masks[i]`, `temperature[i]`, NaN: the request's own): each takes it
        (`_take_mask`), and its plan is that mask (what `_plan` gives such a row), in one loop."""
        temperatures: list[float | None] = []
        for pos, s in enumerate(batch):
            s._take_mask(temperature[pos], masks, pos)
            s._replay = False   # the mask is this step's own: nothing to replay
            temperatures.append(s._temperature)
        self._log_variables(batch)
        return StepPlan(masks, temperatures)

    @staticmethod
    def _log_variables(batch: list[Steered]) -> None:
        if log.isEnabledFor(logging.DEBUG):   # changes not taken cost nothing (host.c coalesces them per name)
            for s in batch:
                for _seq_id, op, name, value in (s.request.take_var_changes() if s.request else ()):
                    log.debug("%s var %s %s = %r", s.label, op, name, value[:80])

