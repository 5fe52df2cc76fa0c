"""A batched generation loop that runs controllers through the runtime's public embedding API.

One step (see docs/embedding.md), like nano-vllm's schedule -> run -> postprocess:

    live = self.scheduler.schedule()       # the running requests' live sequences
    batch = self._lagging(live)            # caches behind their token lists
    handle = self._submit(live)            # controllers start on worker threads
    self._forward(batch)                   # the forward pass runs meanwhile
    outcome = handle.wait()                # late controllers no-op this step ("pending")
    self._apply(live, outcome, events)     # mask, sample, splice, fork, stop (SPEC §3)
    self._retire(events)                   # variable changes out; finished requests let go

The engine keeps two invariants the rest relies on:
- `seq.tokens` is the sequence's full token list (prompt + generated, after every splice); the
  runtime derives each controller's net edit from it, so the engine never computes edits itself;
- each KV cache holds a prefix of `seq.tokens`. A step forwards only the tokens past that prefix,
  and a sequence whose tokens did not change (a no-op or a pending step) reuses its last logits.

Finish reasons: "stop" (controller returned no branch), "eos" (EOS sampled and kept: no splice
took it back), "length" (max_tokens appended), "error" (this sequence only; message in `error`),
"abort" (or the reason given to `Engine.abort`).

Threads: an Engine is not thread-safe. One thread drives it (`add_request`, `step`, `abort`,
`close`); a server with several client threads hands requests and aborts to that thread.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..capabilities import Capabilities
from ..errors import AicirtError
from ..results import StepInput, StepResult
from .backends.base import Backend
from .sampling import SamplingParams, apply_masks, sample
from .scheduler import Scheduler
from .types import EngineStats, Event, FinishEvent, ForkEvent, GenRequest, GenSeq, LogEvent, TokensEvent, VarEvent


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


def _logits(s: GenSeq) -> np.ndarray:
    if s.logits is None:   # every live sequence has them once the step's forward pass is done
        raise RuntimeError(f"engine bug: sequence {s.label} of request {s.request.id} has no logits")
    return s.logits


class Engine:
    """Drives a `Backend` and (for controlled requests) an `aicirt.Runtime`.

    `runtime`: an existing Runtime over the backend's tokenizer; None creates one on the first
    controlled request (with `workers` and `limits`) and closes it in `close()`.

    The engine holds a request from `add_request` until the `step()` that returns its last
    events (its `FinishEvent`s); from then on only the caller's `GenRequest` holds the results.
    Not thread-safe: drive it from one thread.
    """

    def __init__(self, backend: Backend, runtime=None, *, workers: int = 2, limits=None):
        self.backend = backend
        self._runtime = runtime
        self._owns_runtime = runtime is None
        self._workers, self._limits = workers, limits
        self.scheduler = Scheduler()
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._events: list[Event] = []     # happened between steps; the next step returns them
        self._closed = False

    @property
    def runtime(self):
        """The `aicirt.Runtime`, created on first use."""
        if self._runtime is None:
            from ..runtime import Runtime

            self._runtime = Runtime(self.backend.runtime_tokenizer(), limits=self._limits, workers=self._workers)
        return self._runtime

    @property
    def requests(self) -> list[GenRequest]:
        """The requests the engine still holds: waiting, running, or finished with events not yet
        returned by `step()`. Retired requests are not here."""
        return list(self.scheduler)

    @property
    def has_unfinished(self) -> bool:
        """True while the engine holds a request (one that is live, or whose events are pending)."""
        return not self.scheduler.is_empty

    # --- requests --------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], controller=None, arg: bytes | str = b"", *,
                    capabilities=None, params: SamplingParams | None = None, chat: bool = True) -> GenRequest:
        """Queue a request; it starts with the next step.

        `prompt`: text (wrapped in the model's chat template when `chat`) or token ids.
        `controller`: None (plain generation), an `aicirt.Controller`, or a .wasm path or bytes.
        Raises `ValueError` for an empty prompt, a token id out of range or a closed engine,
        `aicirt.LoadError` for a bad module; then nothing is queued. A controller whose instantiation fails gives a request
        whose only sequence ended with an error (its `FinishEvent` comes with the next step).
        """
        if self._closed:
            raise ValueError("engine closed")
        params = params or SamplingParams()
        tokens = self._prompt_tokens(prompt, chat)
        ctrl, seq_ctrl, spawn_error = self._start_controller(controller, arg, capabilities)
        try:
            cache = self.backend.new_cache()
        except BaseException:
            if ctrl is not None:
                ctrl.close()
            raise
        req = GenRequest(id=next(self._ids), prompt=tokens, params=params,
                         rng=np.random.default_rng(params.seed), ctrl=ctrl)
        seq = GenSeq(req, label=0, tokens=list(tokens), cache=cache, ctrl=seq_ctrl)
        req.sequences.append(seq)
        if spawn_error is not None:
            self._finish(seq, "error", spawn_error, self._events)
        self.scheduler.add(req)
        return req

    def _prompt_tokens(self, prompt: str | list[int], chat: bool) -> list[int]:
        if isinstance(prompt, str):
            tokens = list(self.backend.format_prompt(prompt, chat=chat))
        else:
            tokens = [int(t) for t in prompt]
            bad = next((t for t in tokens if not 0 <= t < self.backend.vocab_size), None)
            if bad is not None:
                raise ValueError(f"prompt token {bad} is out of range (the model has {self.backend.vocab_size} tokens)")
        if not tokens:
            raise ValueError("the prompt has no tokens")
        return tokens

    def _start_controller(self, controller, arg: bytes | str, capabilities):
        """(runtime request, first sequence, spawn error): all None without a controller.

        Loading raises (`LoadError`) before anything exists; a failed spawn is the request's
        business (its sequence ends with the error), anything else closes what was made."""
        if controller is None:
            return None, None, None
        rt = self.runtime
        if not hasattr(controller, "sha256"):
            controller = rt.load(controller)
        ctrl = rt.new_request(controller, arg, Capabilities.ALL if capabilities is None else capabilities)
        try:
            return ctrl, ctrl.spawn(), None
        except AicirtError as e:
            return ctrl, None, str(e)
        except BaseException:
            ctrl.close()
            raise

    def abort(self, request: GenRequest, reason: str = "abort") -> None:
        """End every live sequence of `request` now with finish reason `reason`, freeing their
        caches and controllers; their `FinishEvent`s come with the next step, which retires the
        request. A no-op for a request that has finished or that this engine does not hold (a
        server may call it when a client disconnects, whatever the request's state). Raises
        `ValueError` if `reason` is not a non-empty string."""
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"abort reason must be a non-empty string, not {reason!r}")
        if request not in self.scheduler:
            return
        live = [s for s in request.sequences if s.finish_reason is None]
        for s in live:
            self._finish(s, reason, None, self._events)
        if live:
            self.scheduler.finish(request)

    def run(self) -> Iterator[Event]:
        """Step until every request has finished, yielding events as they happen."""
        while self.has_unfinished:
            yield from self.step()

    def generate(self, prompt, controller=None, arg=b"", **kw) -> GenRequest:
        """Add one request and run the engine until everything has finished."""
        req = self.add_request(prompt, controller, arg, **kw)
        for _ in self.run():
            pass
        return req

    # --- one step --------------------------------------------------------------------------
    def step(self) -> list[Event]:
        """Run one step for every live sequence; returns what happened since the last step.

        Requests whose events are in the returned list and that have finished are retired:
        the engine no longer holds them."""
        events, self._events = self._events, []
        live = self.scheduler.schedule()
        if live:
            t0 = time.perf_counter()
            batch = self._lagging(live)
            controlled = [s for s in live if s.ctrl is not None]
            handle = self._submit(controlled)
            t1 = time.perf_counter()
            self._forward(batch)
            t2 = time.perf_counter()
            outcome = handle.wait() if handle is not None else None
            t3 = time.perf_counter()
            self._apply(live, controlled, outcome, events)
            t4 = time.perf_counter()
            self._count(batch, outcome, t0, t1, t2, t3, t4)
        self._retire(events)
        return events

    def _lagging(self, live: list[GenSeq]) -> list[tuple[GenSeq, list[int]]]:
        """The sequences whose caches lag behind their token lists (new tokens, or a splice
        that backtracked), each with the tokens to forward."""
        batch = []
        for s in live:
            if s.logits is None:
                start = min(s.cache.length, len(s.tokens) - 1)  # re-run the last token for its logits
                if start < s.cache.length:
                    self.backend.backtrack(s.cache, start)
                batch.append((s, s.tokens[start:]))
        return batch

    def _submit(self, controlled: list[GenSeq]):
        """Start the controllers on worker threads; None when no sequence has one."""
        handle = None
        if controlled:
            handle = self.runtime.submit([StepInput(s.ctrl, s.tokens, s.sampled, s.unchanged) for s in controlled])
            for s in controlled:
                s.unchanged = len(s.tokens)
                s.sampled = None
        return handle

    def _forward(self, batch: list[tuple[GenSeq, list[int]]]) -> None:
        """The forward pass, overlapping the controllers."""
        if batch:
            logits = self.backend.forward([(s.cache, toks) for s, toks in batch])
            for (s, _), row in zip(batch, logits):
                s.logits = row

    def _apply(self, live: list[GenSeq], controlled: list[GenSeq], outcome, events: list[Event]) -> None:
        """Mask, sample, splice, fork and stop, as each controller's result says (SPEC §3)."""
        draws: list[_Draw] = []
        for s in live:
            if s.ctrl is None:
                s.sampled = None
                draws.append(_Draw(s, _logits(s), None, s.request.params.temperature))
        if outcome is not None:
            for s, r in zip(controlled, outcome.results):
                self._plan(s, r, outcome.masks, draws, events)
        self._sample(draws)
        for d in draws:
            self._commit(d, events)

    def _retire(self, events: list[Event]) -> None:
        """Stream the variable changes, then let go of the requests that finished."""
        for r in self.scheduler:
            if r.ctrl is not None:
                for seq_id, op, name, value in r.ctrl.take_var_changes():
                    events.append(VarEvent(r, seq_id, op, name, value))
        for r in self.scheduler.postprocess():
            if r.ctrl is not None:
                r.ctrl.close()

    def _count(self, batch, outcome, t0: float, t1: float, t2: float, t3: float, t4: float) -> None:
        stats = self.stats
        stats.steps += 1
        stats.submit_s += t1 - t0
        stats.forward_s += t2 - t1
        stats.wait_s += t3 - t2
        stats.apply_s += t4 - t3
        stats.forwarded_tokens += sum(len(toks) for _, toks in batch)
        if outcome is not None:
            stats.controller_s += sum(r.elapsed_us for r in outcome.results) / 1e6
            stats.blocked_s += outcome.blocked_us / 1e6

    # --- applying results ------------------------------------------------------------------
    def _plan(self, s: GenSeq, r: StepResult, masks: np.ndarray, draws: list[_Draw], events: list[Event]) -> None:
        """Turn one controller result into draws (sampling) or direct edits."""
        if r.logs:
            s.logs.append(r.logs)
            events.append(LogEvent(s.request, s, r.logs))
        if r.status == "pending":
            return  # late: no-op this step; its result comes with a later one
        if r.status == "error":
            self._finish(s, "error", r.error, events)
            return
        if not r.branches:
            self._finish(s, "stop", None, events)
            return
        # Forks first: every branch starts from the tokens and logits this step began with.
        targets = [s]
        for child_ctrl in r.forks:
            child = GenSeq(s.request, label=len(s.request.sequences), tokens=list(s.tokens),
                           cache=self.backend.fork(s.cache), ctrl=child_ctrl, logits=s.logits,
                           generated=s.generated, parent=s.label, unchanged=s.unchanged)
            s.request.sequences.append(child)
            targets.append(child)
            events.append(ForkEvent(s.request, s, child))
        temperature = s.request.params.temperature
        for target, branch in zip(targets, r.branches):
            if branch.mask_row is None:
                self._splice(target, branch.splices[0], events)
            else:
                t = temperature if branch.temperature is None else branch.temperature
                draws.append(_Draw(target, _logits(target), masks[branch.mask_row], t, branch.splices))

    def _sample(self, draws: list[_Draw]) -> None:
        """Mask (one vectorised pass over all masked draws), then sample each draw."""
        if not draws:
            return
        v = self.backend.vocab_size
        masked = [d for d in draws if d.mask is not None]
        if masked:
            logits = np.stack([d.logits for d in masked]).astype(np.float32, copy=True)
            rows = np.stack([d.mask for d in draws if d.mask is not None])
            rt_vocab = self.runtime.vocab_size
            apply_masks(logits[:, :min(v, rt_vocab)], rows)
            if v > rt_vocab:  # logit columns the tokenizer (and so the mask) does not cover
                logits[:, rt_vocab:] = -np.inf
            for d, row in zip(masked, logits):
                d.logits = row
        for d in draws:
            params = d.seq.request.params
            try:
                d.token = sample(d.logits, d.temperature, d.seq.request.rng, params.top_k, params.top_p)
            except ValueError as e:
                d.error = str(e)

    def _commit(self, d: _Draw, events: list[Event]) -> None:
        s = d.seq
        if d.error is not None:
            self._finish(s, "error", d.error, events)
            return
        s.tokens.append(d.token)
        s.sampled = d.token
        s.logits = None
        s.generated += 1
        s.idle_steps = 0
        # The client sees the sampled token even when a splice takes it back at once, so a
        # replaced token shows as a visible backtrack.
        events.append(TokensEvent(s.request, s, 0, [d.token]))
        splice = next((sp for sp in d.splices if not sp.when_sampled or d.token in sp.when_sampled), None)
        if splice is not None and (splice.backtrack or splice.ff_tokens):
            self._splice(s, splice, events)
        elif d.token == self.backend.eos_token_id and not s.request.params.ignore_eos:
            self._finish(s, "eos", None, events)
        else:
            self._check_length(s, events)

    def _splice(self, s: GenSeq, splice, events: list[Event]) -> None:
        """Backtrack then fast-forward; (0, []) is a no-op step."""
        if splice.backtrack == 0 and not splice.ff_tokens:
            s.idle_steps += 1
            if s.idle_steps >= s.request.params.max_idle_steps:
                self._finish(s, "error", f"no-op for {s.idle_steps} steps in a row", events)
            return
        s.idle_steps = 0
        if splice.backtrack > len(s.tokens):
            self._finish(s, "error", f"backtrack {splice.backtrack} reaches past the start of the sequence "
                                     f"({len(s.tokens)} tokens)", events)
            return
        keep = len(s.tokens) - splice.backtrack
        del s.tokens[keep:]
        s.unchanged = min(s.unchanged, keep)
        s.tokens.extend(splice.ff_tokens)
        if s.cache.length > keep:
            self.backend.backtrack(s.cache, keep)
        s.logits = None
        s.generated += len(splice.ff_tokens)
        events.append(TokensEvent(s.request, s, splice.backtrack, list(splice.ff_tokens)))
        if not s.tokens:
            self._finish(s, "error", "a splice left the sequence empty", events)
            return
        self._check_length(s, events)

    def _check_length(self, s: GenSeq, events: list[Event]) -> None:
        if s.generated >= s.request.params.max_tokens:
            self._finish(s, "length", None, events)

    def _finish(self, s: GenSeq, reason: str, error: str | None, events: list[Event]) -> None:
        s.finish_reason, s.error = reason, error
        s.logits = None
        s.text_bytes = self.backend.decode_bytes(s.output_tokens)
        self.backend.free(s.cache)
        if s.ctrl is not None:
            s.ctrl.close()
        events.append(FinishEvent(s.request, s, reason, error))

    def close(self) -> None:
        """Free every cache and controller, and the runtime if this engine made it. Idempotent.
        Sequences still live end with an error ("engine closed"); no events are returned."""
        self._closed = True
        self._events = []
        for r in self.scheduler.drain():
            for s in r.sequences:
                if s.finish_reason is None:
                    self._finish(s, "error", "engine closed", [])
            if r.ctrl is not None:
                r.ctrl.close()
        if self._owns_runtime and self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
