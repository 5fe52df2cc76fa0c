"""The runtime facade an engine holds: one wasmtime Engine, the worker threads, the epoch clock.

The error contract, once: misuse of the API raises (ValueError for a closed object, a sequence
of another runtime, a duplicate in one batch, a second wait; TypeError for a wrong argument
type), the same on both hot paths. Nothing a controller does ever raises: it ends its own
sequence with status "error" and a message, and every other sequence carries on.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Literal

import wasmtime

from .batch import BatchHandle, MaskBuffers
from .capabilities import Capabilities
from .controller import Controller, Source, load_controller
from .host_imports import HostImports
from .limits import Limits
from .native import get_native
from .native.engine_config import KEEP_RESIDENT, make_engine
from .native.linker import define_imports
from .native.resident import ResidentSlots
from .owned import Owned
from .paths import user_cache_dir
from .request import Request
from .results import StepInput
from .sequence import Sequence

if TYPE_CHECKING:
    from .native.compiled import CPool
    from .native.fallback import ThreadPool
    from .tokenizer import Tokenizer


def _tick(engine: wasmtime.Engine, closed: threading.Event, period_s: float) -> None:
    """The epoch clock behind the hard time limit: one tick every `period_s`."""
    while not closed.wait(period_s):
        engine.increment_epoch()


def _shutdown(pool: "CPool | ThreadPool", closed: threading.Event, host: HostImports) -> None:
    pool.close()       # waits for running calls; the epoch clock still ticks, so they end
    closed.set()
    host.close()


def _weak_lookup(rt: "Runtime") -> Callable[[int], Sequence]:
    ref = weakref.ref(rt)

    def lookup(slot_addr: int) -> Sequence:
        runtime = ref()
        if runtime is None:
            raise LookupError("the runtime is gone")
        return runtime._seqs[slot_addr]
    return lookup


class Runtime(Owned):
    """Loads controllers and runs their `mid-process` calls for an engine.

    `tokenizer` supplies the vocabulary (see :mod:`aicirt.tokenizer`); `workers` is the number of
    threads that run controllers while the caller does its forward pass; `cache_dir` keeps
    compiled modules (None: the user cache dir; False: no disk cache); `max_sequences` the live
    instances the pooling allocator has slots for; `prebuild_trie` builds the vocabulary's token
    trie (for the `token-trie` import; ~1 s at 150k tokens) on a background thread right away.
    `resident` (:class:`~aicirt.native.resident.ResidentSlots`) is what freed pooled slots keep
    resident for reuse (bounded by `Limits.resident_bytes`, given back when idle).
    Raises ValueError for a bad tokenizer or settings. Use after `close()` raises ValueError.
    """

    def __init__(self, tokenizer: Tokenizer, limits: Limits | None = None, workers: int = 2,
                 cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
                 max_sequences: int = 1024, prebuild_trie: bool = True) -> None:
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
        self.engine = make_engine(self.limits.stack_bytes, self.limits.memory_bytes, max_sequences)
        # what freed pooled slots keep resident: bounded, and given back when idle
        self.resident = ResidentSlots(self.limits.resident_bytes, self.limits.resident_idle_s, KEEP_RESIDENT,
                                      pool=self.engine)
        self.engine_key = hashlib.sha256(
            f"wasmtime-{importlib.metadata.version('wasmtime')}"
            f"-stack{self.limits.stack_bytes}-epoch-pool{self.limits.memory_bytes}".encode()).hexdigest()[:12]
        self.cache_dir = None if cache_dir is False else (Path(cache_dir) if cache_dir else user_cache_dir()) / "modules"
        self.native = get_native()
        self._seqs: dict[int, Sequence] = {}        # slot address -> sequence (host imports find theirs)
        self._calls_out: set[Sequence] = set()      # calls started and not yet collected
        self._closing_seqs: list[Sequence] = []     # closed while their call was out
        # The handlers live in a process-wide registry: they must not keep this runtime alive.
        self._host = HostImports(self.native, tokenizer, _weak_lookup(self), self.limits.host_arg_bytes)
        if prebuild_trie:
            self._host.prebuild_trie()
        self._pres: dict[str, wasmtime.InstancePre] = {}
        self._controllers: weakref.WeakSet[Controller] = weakref.WeakSet()
        self._masks = MaskBuffers(self.mask_words)
        self._lock = threading.Lock()
        self._pool = self.native.make_pool(workers, workers + self.limits.max_extra_workers,
                                           self.limits.soft_deadline_s / 2)
        self._stop_clock = threading.Event()
        self._ticker = threading.Thread(target=_tick, args=(self.engine, self._stop_clock, self.limits.epoch_tick_s),
                                        daemon=True, name="aicirt-epoch")
        self._ticker.start()
        # At interpreter exit (or when collected), let running calls end before Python goes away:
        # worker threads may still call back into Python through host imports.
        self._shutdown = weakref.finalize(self, _shutdown, self._pool, self._stop_clock, self._host)

    # -- controllers and requests --------------------------------------------------------------
    def load(self, src: Source) -> Controller:
        """A controller from a path or bytes: validated, rewritten for fork, compiled (cached).
        Raises LoadError naming what is wrong."""
        self._check_open()
        ctrl = load_controller(self.engine, self.engine_key, src, max_bytes=self.limits.upload_bytes,
                               compile_timeout_s=self.limits.compile_timeout_s, cache_dir=self.cache_dir,
                               memory_bytes=self.limits.memory_bytes)
        self._controllers.add(ctrl)
        return ctrl

    def new_request(self, controller: Controller, arg: bytes | str = b"",
                    capabilities: Capabilities = Capabilities.ALL) -> Request:
        """A request for `controller` (from :meth:`load`) with its argument and the capabilities
        this host grants. Raises TypeError for a controller that is not a loaded Controller."""
        self._check_open()
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

    @property
    def live_sequences(self) -> int:
        """Sequences whose instance and Store are still allocated (closing ones included)."""
        return len(self._seqs)

    # -- internals used by sequences and batches --------------------------------------------
    def _instance_pre(self, controller: Controller) -> wasmtime.InstancePre:
        pre = self._pres.get(controller.sha256)
        if pre is None:
            linker = wasmtime.Linker(self.engine)
            define_imports(self.native, linker, self._host, controller.wasi_imports)
            pre = self._pres[controller.sha256] = linker.instantiate_pre(controller.module)
        return pre

    def _register(self, seq: Sequence) -> None:
        with self._lock:
            self._seqs[self.native.addr(seq.slot)] = seq

    def _unregister(self, seq: Sequence) -> None:
        with self._lock:
            self._seqs.pop(self.native.addr(seq.slot), None)
            self._calls_out.discard(seq)

    def _call_started(self, seq: Sequence) -> None:
        self._calls_out.add(seq)

    def _call_collected(self, seq: Sequence) -> None:
        self._calls_out.discard(seq)

    def _pinned_buffers(self) -> set[int]:
        """Mask arrays a call still out may write into (never reused while so)."""
        return {id(s.mask_buffer[0].base) for s in self._calls_out if s.mask_buffer is not None}

    def _closing(self, seq: Sequence) -> None:
        with self._lock:
            self._closing_seqs.append(seq)

    def _reap(self) -> None:
        """Free sequences closed while their call was out, once the call has ended."""
        with self._lock:
            done = [s for s in self._closing_seqs if s.slot.done]
            self._closing_seqs = [s for s in self._closing_seqs if not s.slot.done]
        for s in done:
            s._collected()

    def _release(self) -> None:
        """Stop the workers and the epoch clock and free every sequence."""
        self._shutdown()       # running calls end (by their deadline) before this returns
        with self._lock:
            self._closing_seqs.clear()
            seqs = list(self._seqs.values())
        for seq in seqs:
            seq._free()
        self.resident.close()
        self._pres.clear()
        for ctrl in self._controllers:   # a Controller the caller keeps must not keep the engine
            ctrl._release()
