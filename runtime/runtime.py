"""The runtime facade an engine holds: one wasmtime Engine, the worker threads, the epoch clock."""
from __future__ import annotations

import hashlib
import importlib.metadata
import threading
import weakref
from pathlib import Path
from typing import Iterable

import wasmtime
from wasmtime import _ffi as wt_ffi

from .batch import BatchHandle, MaskBuffers
from .capabilities import Capabilities
from .controller import Controller, load_controller
from .host_imports import HostImports
from .limits import Limits
from .native import get_native
from .paths import user_cache_dir
from .request import Request
from .sequence import Sequence

# Linear memory a pooled slot keeps mapped when freed: a fork's copy then lands on resident pages
# (1 MiB: ~0.9 ms with fresh mmap pages, ~0.14 ms with resident ones, measured here).
_KEEP_RESIDENT = 4 << 20


def _enable_pooling(cfg: wasmtime.Config, slots: int, memory_bytes: int) -> None:
    """Pooling instance allocator (not exposed by wasmtime-py's Config, so set through its C API):
    instances and memories come from preallocated slots instead of fresh mmaps.

    Each slot reserves only the memory limit plus a small guard (not wasmtime's default 4 GiB,
    which would reserve terabytes of address space per Runtime and run out after a few dozen
    runtimes); the price is explicit bounds checks in controller code."""
    cfg.memory_reservation = memory_bytes
    cfg.memory_guard_size = 2 << 20
    pc = wt_ffi.wasmtime_pooling_allocation_config_new()
    wt_ffi.wasmtime_pooling_allocation_config_total_core_instances_set(pc, slots)
    wt_ffi.wasmtime_pooling_allocation_config_total_memories_set(pc, slots)
    wt_ffi.wasmtime_pooling_allocation_config_total_tables_set(pc, slots)
    wt_ffi.wasmtime_pooling_allocation_config_total_stacks_set(pc, 1)  # async fiber stacks: unused
    wt_ffi.wasmtime_pooling_allocation_config_max_memory_size_set(pc, memory_bytes)
    wt_ffi.wasmtime_pooling_allocation_config_linear_memory_keep_resident_set(pc, min(_KEEP_RESIDENT, memory_bytes))
    wt_ffi.wasmtime_pooling_allocation_strategy_set(cfg.ptr(), pc)
    wt_ffi.wasmtime_pooling_allocation_config_delete(pc)


def _tick(engine: wasmtime.Engine, closed: threading.Event, period_s: float) -> None:
    """The epoch clock behind the hard time limit: one tick every `period_s`."""
    while not closed.wait(period_s):
        engine.increment_epoch()


def _shutdown(pool, closed: threading.Event) -> None:
    pool.close()       # waits for running calls; the epoch clock still ticks, so they end
    closed.set()


class Runtime:
    """Loads controllers and runs their `mid-process` calls for an engine.

    `tokenizer` supplies the vocabulary (see :mod:`aicirt.tokenizer`); `workers` is the number of
    threads that run controllers while the caller does its forward pass; `cache_dir` keeps
    compiled modules (None: the user cache dir; False: no disk cache); `max_sequences` the live
    instances the pooling allocator has slots for; `prebuild_trie` builds the vocabulary's token
    trie (for the `token-trie` import; ~1 s at 150k tokens) on a background thread right away.
    Raises ValueError for a bad tokenizer or settings.
    """

    def __init__(self, tokenizer, limits: Limits | None = None, workers: int = 2, cache_dir=None,
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
        self.mask_words = (self.vocab_size + 31) // 32
        cfg = wasmtime.Config()
        cfg.epoch_interruption = True
        cfg.max_wasm_stack = self.limits.stack_bytes
        _enable_pooling(cfg, max_sequences, self.limits.memory_bytes)
        self.engine = wasmtime.Engine(cfg)
        self.engine_key = hashlib.sha256(
            f"wasmtime-{importlib.metadata.version('wasmtime')}"
            f"-stack{self.limits.stack_bytes}-epoch-pool{self.limits.memory_bytes}".encode()).hexdigest()[:12]
        self.cache_dir = None if cache_dir is False else (Path(cache_dir) if cache_dir else user_cache_dir()) / "modules"
        self.native = get_native()
        self._host = HostImports(tokenizer, self._lookup)
        if prebuild_trie:
            self._host.prebuild_trie()
        self._seqs: dict[int, Sequence] = {}
        self._pres: dict[str, wasmtime.InstancePre] = {}
        self._deferred: list[Sequence] = []
        self._in_flight: set[Sequence] = set()     # calls started and not yet collected
        self._masks = MaskBuffers(self.mask_words)
        self._lock = threading.Lock()
        self._pool = self.native.make_pool(workers)
        self._closed = threading.Event()
        self._ticker = threading.Thread(target=_tick, args=(self.engine, self._closed, self.limits.epoch_tick_s),
                                        daemon=True, name="aicirt-epoch")
        self._ticker.start()
        # At interpreter exit (or when collected), let running calls end before Python goes away:
        # worker threads may still call back into Python through host imports.
        self._shutdown = weakref.finalize(self, _shutdown, self._pool, self._closed)

    # -- controllers and requests --------------------------------------------------------------
    def load(self, src) -> Controller:
        """A controller from a path or bytes: validated, rewritten for fork, compiled (cached).
        Raises LoadError naming what is wrong."""
        return load_controller(self.engine, self.engine_key, src, max_bytes=self.limits.upload_bytes,
                               compile_timeout_s=self.limits.compile_timeout_s, cache_dir=self.cache_dir)

    def new_request(self, controller: Controller, arg: bytes | str = b"",
                    capabilities: Capabilities = Capabilities.ALL) -> Request:
        if isinstance(arg, str):
            arg = arg.encode("utf-8")
        return Request(self, controller, arg, capabilities)

    def submit(self, items: Iterable[tuple]) -> BatchHandle:
        """Start `mid-process` for each `(sequence, tokens, sampled)`: its full current token list
        and the sampled token or None; returns at once. Call `.wait()` on the handle after the
        forward pass.

        An item may add a 4th element, `unchanged`: how many leading tokens are the same as in
        this sequence's previous submit (an engine knows: the least length it backtracked to).
        The runtime then compares only from there, instead of the whole list (~7 µs per 4k
        tokens). A wrong hint gives the controller a wrong edit."""
        return BatchHandle(self, items)

    # -- internals used by sequences -----------------------------------------------------------
    def _instance_pre(self, controller: Controller) -> wasmtime.InstancePre:
        pre = self._pres.get(controller.sha256)
        if pre is None:
            linker = wasmtime.Linker(self.engine)
            self._host.define(linker, controller.wasi_imports)
            pre = self._pres[controller.sha256] = linker.instantiate_pre(controller.module)
        return pre

    def _register(self, key: int, seq: Sequence) -> None:
        with self._lock:
            self._seqs[key] = seq

    def _unregister(self, key: int) -> None:
        with self._lock:
            self._seqs.pop(key, None)

    def _lookup(self, key: int) -> Sequence:
        return self._seqs[key]

    def _defer_close(self, seq: Sequence) -> None:
        with self._lock:
            self._deferred.append(seq)

    def _reap(self) -> None:
        with self._lock:
            done = [s for s in self._deferred if s.slot is None or s.slot.done]
            self._deferred = [s for s in self._deferred if s not in done]
        for s in done:   # their calls ended uncollected: unpin their mask buffers too
            s.in_flight = None
            self._in_flight.discard(s)
            s.close()

    def close(self) -> None:
        """Stop the workers and the epoch clock and free every sequence. Idempotent."""
        if self._closed.is_set():
            return
        self._shutdown()
        self._reap()
        for seq in list(self._seqs.values()):
            seq.in_flight = None
            seq.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
