"""The runtime facade an engine holds: one wasmtime Engine, the worker threads, the epoch clock."""
from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import wasmtime

from .batch import BatchHandle
from .capabilities import Capabilities
from .controller import Controller, load_controller
from .host_imports import HostImports
from .limits import Limits
from .native import get_native
from .request import Request
from .sequence import Sequence


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "aicirt"


class Runtime:
    """Loads controllers and runs their `mid-process` calls for an engine.

    `tokenizer` supplies the vocabulary (see :mod:`aicirt.tokenizer`); `workers` is the number of
    threads that run controllers while the caller does its forward pass; `cache_dir` keeps
    compiled modules (None: the user cache dir; False: no disk cache).
    Raises ValueError for a bad tokenizer or settings.
    """

    def __init__(self, tokenizer, limits: Limits | None = None, workers: int = 2, cache_dir=None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
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
        self.engine = wasmtime.Engine(cfg)
        self.engine_key = hashlib.sha256(
            f"wasmtime-{wasmtime.__version__ if hasattr(wasmtime, '__version__') else '50'}"
            f"-stack{self.limits.stack_bytes}-epoch".encode()).hexdigest()[:12]
        self.cache_dir = None if cache_dir is False else Path(cache_dir or default_cache_dir()) / "modules"
        self.native = get_native()
        self._host = HostImports(tokenizer, self._lookup)
        self._seqs: dict[int, Sequence] = {}
        self._pres: dict[str, wasmtime.InstancePre] = {}
        self._deferred: list[Sequence] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aicirt-worker")
        self._closed = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True, name="aicirt-epoch")
        self._ticker.start()

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

    def submit(self, items: Iterable[tuple[Sequence, list[int], int | None]]) -> BatchHandle:
        """Start `mid-process` for each (sequence, its full current token list, sampled token or
        None); returns at once. Call `.wait()` on the handle after the forward pass."""
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
        for s in done:
            s.in_flight = None
            s.close()

    def _tick(self) -> None:
        while not self._closed.wait(self.limits.epoch_tick_s):
            self.engine.increment_epoch()

    def close(self) -> None:
        """Stop the workers and the epoch clock and free every sequence. Idempotent."""
        if self._closed.is_set():
            return
        self._pool.shutdown(wait=True)
        self._closed.set()
        self._reap()
        for seq in list(self._seqs.values()):
            seq.in_flight = None
            seq.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
