"""aicirt controllers inside vLLM's Model Runner V2 (the GPU default since vLLM 0.33).

    vllm serve MODEL --logits-processors aicirt.integrations.vllm:AicirtLogitsProcessor

The same name as under the V1 runner: that class is also an MRV2 processor and becomes this one
when MRV2 builds it (`both_runners`). This module imports only vLLM's import-light interface
module, so the frontend's `validate_params` (which imports the class) stays light; torch and
the runtime come with the first instance, in the worker.

MRV2's interface (`vllm.v1.worker.gpu.sample.logits_processor.interface`) and how it is used:

- `add_request(slot, params)`: a request enters a persistent slot (a slot is recycled with no
  removal hook: a new occupant releases the old one: freed if done, kept for its return if it was
  preempted). Warm-up calls it with dummy params: no controller, so nothing happens.
- `apply_staged_writes()` (before the forward pass): the committed tokens of every controlled
  slot are read from `req_states.all_token_ids` up to `total_len` (on a GPU: the UVA host buffer;
  `total_len` is a device tensor, so this is one small device-to-host copy a step); a new
  controller starts from the prompt and any output a resumed (preempted) request brings
  (`prefill_len > prompt_len`); then every controller starts its call (`Steering.begin`).
- `apply(logits, ctx)`: the masks go on the rows (`ctx.idx_mapping_np`); under speculative
  decoding a request owns one row per draft (`ctx.expanded_idx_mapping`, `ctx.expanded_local_pos`,
  the drafts in `ctx.input_ids`), and the draft rows are masked through the runtime's speculation
  call (`aicirt.core.speculate`): row j gets the mask the controller gives after drafts 1..j. At the
  next step the accepted prefix is committed and the bonus token is the one sampled after it.

Async scheduling is handled: the previous step's sampled tokens are read in
`apply_staged_writes` from the device buffers, which waits for that step's sampling to finish
(the one synchronisation this processor adds a step; docs/vllm.md says what it costs).

Draft rows: steering is simulated on a copy of the request's state, draft by draft, as if vLLM had
appended each draft in a step of its own: the copy makes the call steering would make (on a
copy-fork, through `aicirt.core.speculate`) or none while it forces fast-forward tokens, and plans the
next row; at the next step the state after the accepted drafts is put back. So every row gets
exactly the plan steering would give there (a mask, a forced token, EOS after a stop, the error
text after an error). Where a row cannot be planned (a call still running, a no-op, a fork), the
rows past it are masked like it and, should vLLM accept drafts past it, the request ends with a
clear error (`[aicirt error: ...]`) instead of going on unchecked.
"""
from __future__ import annotations

import copy
import logging
from collections import OrderedDict, deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from vllm.v1.worker.gpu.sample.logits_processor.interface import (
    LogitsContext,
    LogitsProcessor,
    LogitsProcRequestState,
)

from .vllm_requests import RequestControllers

if TYPE_CHECKING:
    import numpy as np
    import torch
    from vllm.sampling_params import SamplingParams

    from ..core.runtime import Runtime
    from ..core.speculate import Speculation
    from .steering import Steered, Steering

log = logging.getLogger("aicirt.integrations")

__all__ = ["AicirtMRV2LogitsProcessor", "both_runners"]


class _Slot:
    """One persistent slot's controlled request, and its drafts of this step."""
    __slots__ = ("params", "steered", "known", "temperature", "spec_row", "drafts", "masks", "temps", "limit",
                 "states")

    def __init__(self, params: "SamplingParams") -> None:
        self.params = params
        self.steered: Steered | None = None
        self.known = 0                      # committed tokens taken in (prompt + output)
        self.temperature = float(params.temperature)
        self._reset()

    def _reset(self) -> None:
        self.spec_row: tuple[int, int] | None = None   # (which of this step's Speculations, its row there)
        self.drafts: list[int] = []
        self.masks: list[Any] = []          # masks[j]: the plan of row j (uint32 words), for j <= limit
        self.temps: list[float | None] = []
        self.limit = 0                      # the most drafts that may be accepted
        self.states: list[Any] = [None]     # states[j]: steering's state after j accepted drafts, and
                                            # the speculation calls that took (j >= 1)


class _StateView:
    """A saved state as an object `_state` can copy again (the saved one stays untouched)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


_OWN = frozenset({"output", "seq", "request", "label", "_steering", "_closed"})


def _clone(s: "Steered") -> "Steered":
    """A copy of a request's steering state to simulate the next steps on (its lists its own)."""
    c = copy.copy(s)
    c.output, c.tokens, c._forced = list(s.output), list(s.tokens), deque(s._forced)
    return c


def _state(s: Steered | _StateView) -> dict[str, Any]:
    """What `_clone`'s simulation changed, to put back into the real request's state (from a
    `Steered`, or a `_StateView` of one saved)."""
    return {k: (list(v) if k == "tokens" else deque(v) if k == "_forced" else v)
            for k, v in s.__dict__.items() if k not in _OWN}


@contextmanager
def _quiet() -> Iterator[None]:
    """Planning on a copy must not log the copy's controller error (the real one logs it if taken)."""
    was = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = was


def _host(t: Any) -> "np.ndarray":
    """A vLLM buffer's values on the host: the numpy source of truth of a UVA-backed tensor, the
    host side of a UVA staged tensor, else a copy of the device tensor (a synchronisation)."""
    if hasattr(t, "np"):
        return t.np
    uva = getattr(t, "_uva_buf", None)
    if uva is not None:
        return uva.np
    return t.gpu.cpu().numpy()


class AicirtMRV2LogitsProcessor(LogitsProcessor, RequestControllers):
    """vLLM Model Runner V2 logits processor that runs each controlled request's controller."""

    @classmethod
    def validate_params(cls, sampling_params: "SamplingParams") -> None:
        """At admission, in the frontend: as the V1 processor's (`aicirt.integrations.vllm`),
        imported here on the first call so that importing this class stays light."""
        from .vllm import AicirtLogitsProcessor
        AicirtLogitsProcessor.validate_params(sampling_params)

    def __init__(self, vllm_config: Any, req_states: LogitsProcRequestState) -> None:
        """Loads the model's tokenizer; the runtime starts with the first controlled request.
        Raises ValueError for a slow-only tokenizer or a bad ``AICIRT_VLLM_ALLOW_PATHS``."""
        from .torch_masks import MaskBiases
        from .vllm import _route_logs_to_vllm, model_tokenizer, paths_allowed
        paths_allowed()
        _route_logs_to_vllm()
        self.req_states = req_states
        self.device = req_states.device
        mc = vllm_config.model_config
        self._tokenizer = model_tokenizer(mc.tokenizer, mc.tokenizer_revision, mc.trust_remote_code)
        self._eos = int(self._tokenizer.eos_token_id)
        self._steering: Steering | None = None
        self._controllers: dict[str, object] = {}
        self._slots: dict[int, _Slot] = {}
        self._parked: OrderedDict[int, tuple[SamplingParams, Steered]] = OrderedDict()
        self._began: dict[int, int] = {}    # slot -> its position in this step's batch
        self.applied: tuple[list[int], Any] = ([], None)   # the last apply's rows and their masks
        self._specs: list[Speculation] = []   # this step's draft calls, committed at the next
        self._biases = MaskBiases()
        self._opened = 0

    @property
    def steering(self) -> "Steering":
        if self._steering is None:
            from ..limits import Limits
            from ..core.runtime import Runtime
            from .steering import Steering
            self._steering = Steering(Runtime(self._tokenizer, limits=Limits(), workers=2), self._eos)
        return self._steering

    @property
    def started(self) -> bool:
        return self._steering is not None

    # -- slots ------------------------------------------------------------------------------------
    def add_request(self, req_idx: int, sampling_params: "SamplingParams") -> bool:
        """A request enters slot `req_idx`: the slot's previous occupant is released (freed if
        done, parked if preempted). Returns whether this request has a controller."""
        from .vllm import request_controller
        old = self._slots.pop(req_idx, None)
        if old is not None:
            self._release(old)
        try:
            found = request_controller(sampling_params)
        except ValueError:   # refused at admission; a direct caller's malformed request is not ours
            return False
        if found is None:
            return False
        self._slots[req_idx] = _Slot(sampling_params)
        return True

    def _release(self, slot: _Slot) -> None:
        """The slot's request left: freed if done, parked if preempted (the V1 processor's rule)."""
        if slot.steered is not None:
            self._park_or_free(slot.params, slot.steered)

    def _open(self, slot: _Slot, tokens: list[int], prompt_len: int) -> Steered:
        """The slot's request's controller: its parked one if it comes back from preemption (its
        output as it left, plus at most the token of its last step), else a new one (the V1
        processor's: `RequestControllers._open_request`, load, or a message saying why not)."""
        parked = self._parked.pop(id(slot.params), None)
        output = tokens[prompt_len:]
        if parked is not None:
            s = parked[1]
            if parked[0] is slot.params and output[:len(s.output)] == s.output and len(output) - len(s.output) <= 1:
                s.output.extend(output[len(s.output):])   # the token of its last step: observed at begin
                return s
            s.close()
        opened = self._open_request(slot.params, tokens[:prompt_len], list(output))
        assert opened is not None      # a slot is made only for a request that names a controller (add_request)
        return opened

    # -- before the forward pass ------------------------------------------------------------------
    def apply_staged_writes(self) -> None:
        """Take in each controlled slot's committed tokens (committing last step's drafts), then
        start the controllers."""
        import numpy as np
        specs, self._specs = self._specs, []
        if not self._slots:
            for spec in specs:
                spec.close()
            if self._steering is not None and self._steering.pending:
                self._steering.end()
            return
        rs = self.req_states
        total = _host(rs.total_len)
        prompt_len = _host(rs.prompt_len)
        all_tokens = rs.all_token_ids
        uva = getattr(all_tokens, "_uva_buf", None)
        accepted = [np.zeros(len(spec), dtype=np.int64) for spec in specs]
        batch: list[Steered] = []
        self._began = {}
        for idx in sorted(self._slots):
            slot = self._slots[idx]
            n = int(total[idx])
            if slot.steered is None:
                row = uva.np[idx, :n] if uva is not None else all_tokens.gpu[idx, :n].cpu().numpy()
                slot.steered = self._open(slot, [int(t) for t in row.tolist()], int(prompt_len[idx]))
                slot.known = n
            elif n > slot.known:
                row = uva.np[idx, slot.known:n] if uva is not None else all_tokens.gpu[idx, slot.known:n].cpu().numpy()
                new = [int(t) for t in row.tolist()]
                if slot.drafts:
                    a = self._take_drafts(slot, new)
                    if slot.spec_row is not None:
                        accepted[slot.spec_row[0]][slot.spec_row[1]] = a
                slot.steered.output.extend(new)
                slot.known = n
            slot._reset()
            self._began[idx] = len(batch)
            batch.append(slot.steered)
        for spec, acc in zip(specs, accepted):
            spec.commit(acc)
        self.steering.begin(batch)

    def _take_drafts(self, slot: _Slot, new: list[int]) -> int:
        """vLLM appended `new` (the accepted drafts, then the token sampled after them) to a slot
        that had drafts: its steering state becomes the simulated one after the accepted drafts
        (`_draft_rows`). Returns the speculation calls its row commits."""
        s = slot.steered
        assert s is not None
        a = len(new) - 1
        if a == 0 or s.finished:
            return 0
        if new[:a] != slot.drafts[:a]:
            s._fail(f"vLLM appended {new[:a]} where the drafts were {slot.drafts[:a]}")
            return 0
        if a > slot.limit:
            s._fail(f"vLLM accepted {a} draft tokens where the controller's masks were known for {slot.limit} "
                    f"(a call still running, or a no-op)")
            return 0
        state, calls = slot.states[a]
        s.__dict__.update(_state(_StateView(state)))
        if s.error is not None:
            log.warning("%s: controller error, request ended: %s", s.label, s.error)
        return calls

    # -- after the forward pass -------------------------------------------------------------------
    def apply(self, logits: "torch.Tensor", ctx: LogitsContext) -> "torch.Tensor":
        """Wait for the controllers and mask every row of a controlled request in place (draft
        rows included)."""
        if not self._began or self._steering is None or not self._steering.pending:
            return logits
        import numpy as np

        from .torch_masks import apply_plan
        plan = self._steering.end()
        idx_np = ctx.idx_mapping_np
        n_rows = int(logits.shape[0])
        if n_rows == len(idx_np):
            row_slot, local, inputs = np.asarray(idx_np), None, None
        else:   # speculative decoding: a request has one row per draft
            row_slot = ctx.expanded_idx_mapping.cpu().numpy()
            local = ctx.expanded_local_pos.cpu().numpy()
            inputs = ctx.input_ids.cpu().numpy()
        rows: list[int] = []
        masks: list[np.ndarray] = []
        temps: list[float | None] = []
        req_t: list[float] = []
        drafting: dict[int, list[int]] = {}
        for r in range(n_rows):
            idx = int(row_slot[r])
            at = self._began.get(idx)
            if at is None:
                continue
            slot = self._slots[idx]
            if local is None or local[r] == 0:
                rows.append(r)
                masks.append(plan.masks[at])
                temps.append(plan.temperatures[at])
                req_t.append(slot.temperature)
            else:
                drafting.setdefault(idx, []).append(r)
        if drafting:
            assert inputs is not None and local is not None
            self._draft_rows(drafting, plan, inputs, local, rows, masks, temps, req_t)
        if rows:
            stacked = np.stack(masks)
            self.applied = (rows, stacked)   # what the last step applied (benchmarks, tests)
            skipped = apply_plan(logits, rows, stacked, temps, req_t, [True] * len(rows), self._biases)
            for k in skipped:
                log.warning("branch temperature %s not applied on row %d (a greedy request)", temps[k], rows[k])
        return logits

    def _draft_rows(self, drafting: dict[int, list[int]], plan: Any, inputs: "np.ndarray", local: "np.ndarray",
                    rows: list[int], masks: list, temps: list, req_t: list) -> None:
        """The masks of the draft rows. For each drafting request, steering is simulated on a copy
        of its state, draft by draft, as if vLLM had appended each draft in a step of its own: the
        copy observes the draft, makes the call steering would make (on a copy-fork: the runtime's
        speculation call, one batch a depth for all requests) or none while it forces tokens, and
        plans the next row. Row j's mask is that plan; the state after it is kept for the commit."""
        import numpy as np

        from ..core.speculate import Speculation
        words = self.runtime.mask_words
        sims: list[int] = []
        for idx, draft_rows in drafting.items():
            slot, s = self._slots[idx], self._slots[idx].steered
            draft_rows.sort(key=lambda r: int(local[r]))
            slot.drafts = [int(inputs[r]) for r in draft_rows]
            at = self._began[idx]
            slot.masks, slot.temps, slot.states = [plan.masks[at].copy()], [plan.temperatures[at]], [None]
            if s is not None and not s.finished and s.seq is not None:
                sims.append(idx)
        spec = None
        if sims:
            try:
                spec = Speculation(self.runtime, np.array([self._slots[i].steered.seq.index for i in sims]))  # type: ignore[union-attr]
            except ValueError as e:   # e.g. a call still out: these drafts cannot be accepted
                log.debug("no speculation this step: %s", e)
        if spec is not None:
            self._specs.append(spec)
            which = len(self._specs) - 1
            shadows = [_clone(self._slots[i].steered) for i in sims]  # type: ignore[arg-type]
            calls = [0] * len(sims)
            for r, idx in enumerate(sims):
                self._slots[idx].spec_row = (which, r)
            live = list(range(len(sims)))
            j = 0
            while live:
                j += 1
                toks = np.full(len(sims), -1, dtype=np.int64)
                edits: dict[int, tuple[list[int], int]] = {}
                need: list[int] = []
                for r in list(live):
                    slot, sh = self._slots[sims[r]], shadows[r]
                    d = slot.drafts[j - 1] if j <= len(slot.drafts) else -1
                    if d < 0 or not (int(slot.masks[j - 1][d >> 5]) >> (d & 31)) & 1:
                        live.remove(r)   # no draft, or one the row before never samples
                        continue
                    sh.output.append(d)
                    with _quiet():
                        call = sh._begin()
                    if call is not None:
                        need.append(r)
                        toks[r] = call[1]
                        if call[2] is not None:
                            edits[r] = call[2]
                out = spec.extend(toks, edits=edits, skip=set(range(len(sims))) - set(need), go_on=True) if need else None
                for r in list(live):
                    slot, sh = self._slots[sims[r]], shadows[r]
                    row = np.zeros((1, words), dtype=np.uint32)
                    if r in need:
                        assert out is not None
                        if out.ok[r]:
                            sh._take_mask(float(out.temperature[r]), out.masks, r)
                        else:
                            res, own = out.results.get(r, (None, None))
                            with _quiet():
                                again = res is None or sh._take(res, own if own is not None else row, row[0])
                            if again:   # late, a fork or a no-op: the next row cannot be planned
                                live.remove(r)
                                continue
                        calls[r] += 1
                    with _quiet():
                        t = sh._plan(row, 0)
                    slot.masks.append(sh._last_mask.copy() if sh._expect == "sample" and sh._last_mask is not None
                                      else row[0])
                    slot.temps.append(t)
                    slot.states.append((_state(sh), calls[r]))
                    slot.limit = j
                    if sh.finished and not sh._forced:
                        live.remove(r)
        for idx, draft_rows in drafting.items():
            slot = self._slots[idx]
            for j, r in enumerate(draft_rows, start=1):
                known = j < len(slot.masks)
                rows.append(r)
                masks.append(slot.masks[j] if known else slot.masks[-1])
                temps.append(slot.temps[j] if known else None)
                req_t.append(slot.temperature)



def both_runners(v1_class: Any) -> type:
    """The V1 processor class `v1_class` as one class both runners load by the same name: it is a
    subclass of both interfaces (each runner's loader checks its own), and MRV2's constructor
    call (`cls(vllm_config, req_states)`) builds an :class:`AicirtMRV2LogitsProcessor` instead."""

    class AicirtLogitsProcessor(v1_class, AicirtMRV2LogitsProcessor):
        __doc__ = v1_class.__doc__

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            state = kwargs.get("req_states", args[1] if len(args) == 2 else None)
            if isinstance(state, LogitsProcRequestState):
                return AicirtMRV2LogitsProcessor(*args, **kwargs)
            return super().__new__(cls)

        apply = v1_class.apply
        validate_params = v1_class.validate_params

    AicirtLogitsProcessor.__module__ = v1_class.__module__
    AicirtLogitsProcessor.__qualname__ = v1_class.__qualname__
    return AicirtLogitsProcessor
