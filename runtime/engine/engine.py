"""A batched generation loop that runs controllers through the runtime's public embedding API.

One step (see docs/embedding.md), like nano-vllm's schedule -> run -> postprocess:

    live = self.scheduler.schedule()       # the running requests' live sequences
    batch = self._lagging(live)            # caches behind their token lists
    handle = self._submit(controlled)      # controllers start on worker threads
    self._forward(batch)                   # the forward pass runs meanwhile
    outcome = handle.wait()                # late controllers no-op this step ("pending")
    self._apply(live, controlled, outcome, events)   # mask, sample, splice, fork, stop (docs/protocol.md#semantics;
                                           # apply.py)
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
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.batch import row_edit
from ..capabilities import Capabilities
from ..errors import AicirtError
from .apply import Applier
from .backends.base import Backend
from .sampling import SamplingParams
from .scheduler import Scheduler
from .types import EngineStats, Event, GenRequest, GenSeq, VarEvent

if TYPE_CHECKING:
    from ..core.batch import RowsHandle, RowsOutcome
    from ..loader.controller import Controller, Source
    from ..limits import Limits
    from ..core.request import Request
    from ..core.runtime import Runtime


class EngineBase:
    """What the own `Engine` and `aicirt.engine.vllm_engine.VllmEngine` share, everything but
    the step itself: requests (their prompts, controllers, abort, retirement), the runtime (made on
    first use over the backend's tokenizer), its memory budget, the rows submitted each step, the
    stats, and what closing frees. A subclass sets the attributes below and defines `add_request`
    and `step`."""

    backend: Backend
    scheduler: Scheduler
    _applier: Applier
    _runtime: Runtime | None
    _owns_runtime: bool
    _limits: Limits | None
    _workers: int
    _closed: bool
    _events: list[Event]
    stats: EngineStats

    def _release_all(self) -> None:
        """Closing: every request's live sequences end with an error ("engine closed", no events
        returned), every controller is freed, and the runtime too if this engine made it."""
        self._closed = True
        self._events = []
        for r in self.scheduler.drain():
            for s in r.sequences:
                if s.finish_reason is None:
                    self._applier.finish(s, "error", "engine closed", [])
            if r.ctrl is not None:
                r.ctrl.close()
        if self._owns_runtime and self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    @property
    def runtime(self) -> Runtime:
        """The `aicirt.Runtime`, created on first use."""
        if self._runtime is None:
            from ..core.runtime import Runtime

            self._runtime = Runtime(self.backend.runtime_tokenizer(), limits=self._limits, workers=self._workers)
        return self._runtime

    def collect(self) -> None:
        """Free the controllers that were closed while their call ran and whose calls have
        ended (a step does this too); a server calls it while idle, so that their memory and
        memory-budget share come back without another step."""
        if self._runtime is not None:
            self._runtime.collect()

    def has_memory_for(self, sequences: int = 1) -> bool:
        """Whether the runtime's memory budget (Limits.memory_budget_bytes) has room for
        `sequences` new controlled sequences now; True before the runtime exists. A server asks
        before it starts a controlled request, and keeps it waiting otherwise (a request
        started without room ends at once with `aicirt.core.memory.OverBudget`'s message). Safe to
        call from any thread (a racy read)."""
        rt = self._runtime
        return rt is None or rt.memory_budget.room_for(sequences)

    def memory_budget_text(self) -> str:
        """The memory budget's state in words, for an error message."""
        rt = self._runtime
        if rt is None:
            return "no controller runs yet"
        b = rt.memory_budget
        return (f"{b.sequences} live sequences hold {b.reserved_bytes >> 20} MiB of the memory budget of "
                f"{b.limit_bytes >> 20} MiB (Limits.memory_budget_bytes; each reserves {b.per_sequence_bytes >> 20} MiB)")

    def add_request(self, prompt: str | list[int], controller: Any = None, arg: bytes | str = b"", *,
                    capabilities: Capabilities | None = None, params: SamplingParams | None = None,
                    chat: bool = True) -> GenRequest:
        raise NotImplementedError

    def step(self) -> list[Event]:
        raise NotImplementedError

    @property
    def requests(self) -> list[GenRequest]:
        """The requests the engine still holds: waiting, running, or finished with events not yet
        returned by `step()`. Retired requests are not here."""
        return list(self.scheduler)

    @property
    def has_unfinished(self) -> bool:
        """True while the engine holds a request (one that is live, or whose events are pending)."""
        return not self.scheduler.is_empty

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

    def _start_controller(self, controller: Any, arg: bytes | str, capabilities: Capabilities | None
                          ) -> tuple[Request | None, Any, str | None]:
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
            self._applier.finish(s, reason, None, self._events)
        if live:
            self.scheduler.finish(request)

    def run(self) -> Iterator[Event]:
        """Step until every request has finished, yielding events as they happen."""
        while self.has_unfinished:
            yield from self.step()

    def generate(self, prompt: str | list[int], controller: Controller | Source | None = None,
                 arg: bytes | str = b"", **kw: Any) -> GenRequest:
        """Add one request and run the engine until everything has finished."""
        req = self.add_request(prompt, controller, arg, **kw)
        for _ in self.run():
            pass
        return req

    def _submit(self, controlled: list[GenSeq]) -> RowsHandle | None:
        """Start the controllers on worker threads (the runtime's rows API: a row is the
        sequence's index and the token it sampled; only a sequence whose tokens changed
        otherwise, by a prompt, a splice or a fork, hands over its tokens past the part its
        controller saw unchanged); None when no sequence has one."""
        if not controlled:
            return None
        n = len(controlled)
        sampled = np.full(n, -1, dtype=np.int32)
        edits: dict[int, tuple[list[int], int]] = {}
        for i, s in enumerate(controlled):
            edit = row_edit(s.tokens, s.sampled, s.unchanged, s.synced)
            if edit is not None:
                edits[i] = edit
            if s.sampled is not None:
                sampled[i] = s.sampled
            s.unchanged = s.synced = len(s.tokens)
            s.sampled = None
        index = np.fromiter((s.ctrl.index for s in controlled), dtype=np.int64, count=n)
        return self.runtime.submit_rows(index, sampled, edits or None)

    def _retire(self, events: list[Event]) -> None:
        """Stream the variable changes, then let go of the requests that finished."""
        for r in self.scheduler:
            if r.ctrl is not None:
                for seq_id, op, name, value in r.ctrl.take_var_changes():
                    events.append(VarEvent(r, seq_id, op, name, value))
        for r in self.scheduler.postprocess():
            if r.ctrl is not None:
                r.ctrl.close()

    def _count(self, tokens: int, outcome: RowsOutcome | None, submit_s: float, forward_s: float,
               wait_s: float, apply_s: float) -> None:
        """One step into `stats`: `tokens` forwarded, the controllers' time from `outcome`."""
        stats = self.stats
        stats.steps += 1
        stats.submit_s += submit_s
        stats.forward_s += forward_s
        stats.wait_s += wait_s
        stats.apply_s += apply_s
        stats.forwarded_tokens += tokens
        if outcome is not None:
            stats.controller_s += float(outcome.elapsed_us.sum()) / 1e6
            stats.blocked_s += outcome.blocked_us / 1e6


class Engine(EngineBase):
    """Drives a `Backend` and (for controlled requests) an `aicirt.Runtime`.

    `runtime`: an existing Runtime over the backend's tokenizer; None creates one on the first
    controlled request (with `workers` and `limits`) and closes it in `close()`.

    The engine holds a request from `add_request` until the `step()` that returns its last
    events (its `FinishEvent`s); from then on only the caller's `GenRequest` holds the results.
    Not thread-safe: drive it from one thread.
    """

    def __init__(self, backend: Backend, runtime: Runtime | None = None, *, workers: int = 2,
                 limits: Limits | None = None) -> None:
        self.backend = backend
        self._runtime = runtime
        self._owns_runtime = runtime is None
        self._workers, self._limits = workers, limits
        self.scheduler = Scheduler()
        self._applier = Applier(backend)
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._events: list[Event] = []     # happened between steps; the next step returns them
        self._closed = False

    # --- requests --------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], controller: Controller | Source | None = None,
                    arg: bytes | str = b"", *, capabilities: Capabilities | None = None,
                    params: SamplingParams | None = None, chat: bool = True) -> GenRequest:
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
            self._applier.finish(seq, "error", spawn_error, self._events)
        self.scheduler.add(req)
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
            self._count(sum(len(toks) for _, toks in batch), outcome, t1 - t0, t2 - t1, t3 - t2, t4 - t3)
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

    def _forward(self, batch: list[tuple[GenSeq, list[int]]]) -> None:
        """The forward pass, overlapping the controllers."""
        if batch:
            logits = self.backend.forward([(s.cache, toks) for s, toks in batch])
            for (s, _), row in zip(batch, logits):
                s.logits = row

    def _apply(self, live: list[GenSeq], controlled: list[GenSeq], outcome: RowsOutcome | None,
               events: list[Event]) -> None:
        """Mask, sample, splice, fork and stop, as each controller's result says (docs/protocol.md#semantics)."""
        mask_vocab = self.runtime.vocab_size if outcome is not None else 0
        self._applier.apply(live, controlled, outcome, mask_vocab, events)

    def close(self) -> None:
        """Free every cache and controller, and the runtime if this engine made it. Idempotent.
        Sequences still live end with an error ("engine closed"); no events are returned."""
        self._release_all()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
