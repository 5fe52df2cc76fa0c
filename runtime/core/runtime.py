"""The runtime facade an engine holds: one wasmtime Engine, the worker pool and its epoch clock.

The error contract, once: misuse of the API raises (ValueError for a closed object, a sequence
of another runtime, a duplicate in one batch, a second wait; TypeError for a wrong argument
type). Nothing a controller does ever raises: it ends its own
sequence with status "error" and a message, and every other sequence carries on.
"""
from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Literal, Mapping
from typing import Sequence as SeqOf

import wasmtime

from .batch import BatchHandle, RowsHandle
from ..capabilities import Capabilities
from ..loader.controller import Controller, Source, engine_key
from ..host.host_imports import HostImports
from ..limits import Limits
from ..native import get_native
from ..native.engine_config import make_engine, slot_keep_resident
from ..native.instance import SpawnPlan
from ..native.linker import define_imports
from ..owned import Owned
from ..paths import user_cache_dir
from .memory import MemoryBudget, ResidentSlots, default_budget_bytes
from .prepared import TEMPLATE_SLOT_SHARE, PreparedCache
from .registry import Registry
from .request import Request
from .results import StepInput
from ..loader.snapshot import InitHost, load_initialized

if TYPE_CHECKING:
    import numpy as np

    from ..host.tokenizer import Tokenizer
    from ..native import EditArrays
    from ..native.compiled import CPool
    from ..native.types import CData


def _shutdown(pool: "CPool", host: HostImports) -> None:
    pool.close()       # waits for running calls (its epoch clock ticks until they end), then stops the clock
    host.close()


class Runtime(Owned):
    """Loads controllers and runs their `mid-process` calls for an engine.

    `tokenizer` supplies the vocabulary (see :mod:`aicirt.host.tokenizer`); `workers` is the number of
    threads that run controllers while the caller does its forward pass; `cache_dir` keeps
    compiled modules (None: the user cache dir; False: no disk cache); `max_sequences` the live
    instances the pooling allocator has slots for; `prebuild_trie` builds the vocabulary's token
    trie (for the `token-trie` import; ~1 s at 150k tokens) on a background thread right away;
    `steal` lets a caller waiting for a batch run the calls of its rows that no worker has taken
    yet, where the caller-runs rule allows (docs/embedding.md). Off by default: a call run on the
    caller cannot be handed back once it runs long, so a controller cheap so far could hold the
    engine's thread up to its hard limit; turn it on only for trusted controllers (it saves a
    hand-off, about 3 µs a step).
    Raises ValueError for a bad tokenizer or settings. Use after `close()` raises ValueError.
    """

    def __init__(self, tokenizer: Tokenizer, limits: Limits | None = None, workers: int = 2,
                 cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
                 max_sequences: int = 1024, prebuild_trie: bool = True, steal: bool = False) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_sequences < 1:
            raise ValueError(f"max_sequences must be >= 1, got {max_sequences}")
        self.tokenizer = tokenizer
        self.limits = limits or Limits()
        self.workers = workers
        self.vocab_size = int(tokenizer.vocab_size)
        if self.vocab_size < 1:
            raise ValueError("tokenizer.vocab_size must be >= 1")
        eos = tokenizer.eos_token_id
        self.eos_token = int(eos) if eos is not None else 0
        self.mask_words = (self.vocab_size + 31) // 32
        keep_resident = slot_keep_resident(self.limits.resident_bytes, self.limits.memory_bytes)
        self.engine = make_engine(self.limits.stack_bytes, self.limits.memory_bytes, max_sequences, keep_resident)
        self.engine_key = engine_key(self.limits, self.engine)
        self.cache_dir = None if cache_dir is False else (Path(cache_dir) if cache_dir else user_cache_dir()) / "modules"
        self.native = get_native()
        # live sequences, calls out past their batch, mask arrays, what freed slots keep resident
        # what all live sequences may reserve together (memory.py)
        per_sequence = self.limits.memory_bytes + self.limits.log_bytes
        self.memory_budget = MemoryBudget(self.limits.memory_budget_bytes or default_budget_bytes(per_sequence),
                                          per_sequence)
        self.registry = Registry(self.mask_words, self.native.gather_rows, ResidentSlots(
            self.limits.resident_bytes, self.limits.resident_idle_s, keep_resident, pool=self.engine))
        # The handlers live in a process-wide registry: they must not keep this runtime alive.
        self._host = HostImports(self.native, tokenizer, self.registry.lookup, self.limits.host_arg_bytes)
        if prebuild_trie:
            self._host.prebuild_trie()
        host = self._host     # the init snapshots' trie: the same one, never a reference to self
        self._init_host = InitHost(tokenizer, lambda: host.trie, self.eos_token)
        self._pres: dict[tuple[str, bool], wasmtime.InstancePre] = {}
        self._plans: dict[tuple[str, bool], SpawnPlan] = {}
        #: the native slot every sequence starts from: the limits and vocabulary (Sequence adds its request's)
        self.slot_template = self._new_slot_template()
        #: templates of controllers' per-argument work (aicirt_prepare), shared across requests
        self.prepared = PreparedCache(self.native, self.memory_budget, self.registry.resident,
                                      self.limits.prepared_cache_bytes, max_sequences // TEMPLATE_SLOT_SHARE,
                                      per_sequence, self.limits.prepared_after)
        #: batch.py's: the object API's last batch (its sequences, their index array), reused while
        #: the next batch is the same sequences in the same order (an index never changes while its
        #: sequence is open; it keeps that batch's Sequence objects, not their native state, alive
        #: until the next batch; closing any sequence drops it)
        self.object_rows: tuple[list, np.ndarray] | None = None
        self._controllers: weakref.WeakSet[Controller] = weakref.WeakSet()
        # the worker threads that run controller calls (pool.c), with the
        # epoch clock that ticks the engine while calls are out
        self.pool = self.native.make_pool(workers, workers + self.limits.max_extra_workers,
                                          self.limits.soft_deadline_s / 2, steal, self.engine, self.limits.epoch_tick_s)
        # At interpreter exit (or when collected), let running calls end before Python goes away:
        # worker threads may still call back into Python through host imports.
        self._shutdown = weakref.finalize(self, _shutdown, self.pool, self._host)

    # -- controllers and requests --------------------------------------------------------------
    def load(self, src: Source) -> Controller:
        """A controller from a path or bytes: validated, rewritten for fork, compiled (cached);
        one with an init export starts every request from its init snapshot for this tokenizer
        (aicirt.loader.snapshot). Raises LoadError naming what is wrong."""
        self.check_open()
        # an init export runs under the epoch clock, in a template instance no freed slot is given back under
        with self.pool.ticking(), self.registry.resident.paused():
            ctrl = load_initialized(self.engine, self.engine_key, src, self._init_host, self.limits, self.cache_dir)
        self._controllers.add(ctrl)
        return ctrl

    def new_request(self, controller: Controller, arg: bytes | str = b"",
                    capabilities: Capabilities = Capabilities.ALL) -> Request:
        """A request for `controller` (from :meth:`load`) with its argument and the capabilities
        this host grants. Raises TypeError for a controller that is not a loaded Controller."""
        self.check_open()
        if not isinstance(controller, Controller):
            raise TypeError(f"new_request takes a Controller from Runtime.load, got {type(controller).__name__}")
        if isinstance(arg, str):
            arg = arg.encode("utf-8")
        return Request(self, controller, arg, capabilities)

    def submit(self, items: Iterable[StepInput]) -> BatchHandle:
        """Start `mid-process` for each :class:`StepInput` (a sequence, its full current token
        list, the sampled token or None, an optional `unchanged` hint); returns at once. Call
        `.wait()` on the handle after the forward pass.

        Raises, before anything runs: TypeError for an item that is not a StepInput; ValueError
        for a sequence of another runtime, one submitted twice, one closed, one still in a batch
        not waited for, or a closed runtime."""
        return BatchHandle(self, items)

    def submit_rows(self, index: object, sampled: object,
                    edits: "Mapping[int, tuple[SeqOf[int], int]] | EditArrays | None" = None) -> RowsHandle:
        """The array fast path of :meth:`submit`: start `mid-process` for the sequences at
        `index` (int array of `Sequence.index`), row i with the token `sampled[i]` sampled at the
        previous step (int array; -1: none) appended to what its controller saw. A row whose
        tokens changed otherwise (the prompt, a splice, a fork's branch) has an entry in `edits`:
        {row: (tokens past the first `kept`, kept)}, `kept` at most the tokens the controller
        saw (the engine knows: the least length it backtracked to; 0 always works); the
        controller gets the least net edit. A row whose call is still out (PENDING last step)
        carries nothing. Returns at once; `.wait()` after the forward pass gives a
        :class:`RowsOutcome` (arrays; objects only for the rare rows).

        Raises, before anything runs: TypeError for arrays that are not of integers; ValueError
        for an index that is no live sequence of this runtime, a closed one, one submitted twice,
        one still in a batch not waited for, mismatched lengths, or a closed runtime."""
        return RowsHandle(self, index, sampled, edits)

    def collect(self) -> int:
        """Free the sequences closed while their call ran whose calls have ended since (each
        `wait()` does this too): an idle host calls it so that their memory, and their share of
        the memory budget, come back without another batch. Returns how many were freed. Call it
        from the thread that submits."""
        done = self.registry.reap()
        for seq in done:
            seq.collected()
        return len(done)

    @property
    def live_sequences(self) -> int:
        """Sequences whose instance and Store are still allocated (closing ones included)."""
        return len(self.registry)

    def instance_pre(self, controller: Controller) -> wasmtime.InstancePre:
        """The linked, ready-to-instantiate form of `controller` (made once, kept)."""
        key = (controller.sha256, controller.snapshot)
        pre = self._pres.get(key)
        if pre is None:
            linker = wasmtime.Linker(self.engine)
            define_imports(self.native, linker, self._host, controller.wasi_imports)
            pre = self._pres[key] = linker.instantiate_pre(controller.module)
        return pre

    def spawn_plan(self, controller: Controller) -> SpawnPlan:
        """What every instance of `controller` binds (instance.SpawnPlan; made once, kept)."""
        key = (controller.sha256, controller.snapshot)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = SpawnPlan(self.engine, self.instance_pre(controller), controller,
                                                self.limits.memory_bytes)
        return plan

    def _new_slot_template(self) -> "CData":
        slot = self.native.new_slot()
        limits = self.limits
        slot.vocab_size = self.vocab_size
        slot.mask_words = self.mask_words
        slot.eos_token = self.eos_token
        slot.host_arg_cap = limits.host_arg_bytes
        slot.log_cap = limits.log_bytes
        slot.first_call_ticks = limits.ticks(limits.first_call_timeout_s)
        slot.first_budget_us = limits.first_call_timeout_s * 1e6
        slot.call_budget_us = limits.call_timeout_s * 1e6
        slot.tick_us = limits.epoch_tick_s * 1e6
        slot.wall_factor = limits.wall_backstop_factor
        return slot

    def _release(self) -> None:
        """Stop the workers and the epoch clock and free every sequence."""
        self._shutdown()       # running calls end (by their deadline) before this returns
        self.object_rows = None
        for seq in self.registry.clear():
            seq.free()
        self.prepared.close()
        self._pres.clear()
        self._plans.clear()
        self._init_host.forget()
        for ctrl in self._controllers:   # a Controller the caller keeps must not keep the engine
            ctrl.forget_engine()
