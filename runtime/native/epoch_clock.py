"""The fallback's epoch clock: a Python thread that ticks the engine while the pool has calls out.

The compiled hot path has its own clock inside step.c's pool (a pthread: no Python thread wakes
per step there); this one keeps the same contract for :class:`~.fallback.ThreadPool`.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import wasmtime


class EpochClock:
    """The epoch clock behind the hard time limit: one tick every `period_s` while calls are
    running or queued (`pending()` > 0), and no wake-up at all while none is (`kick` after
    queueing calls). `on_tick` runs after each tick (the pool's check for calls no worker was
    woken for)."""

    def __init__(self, engine: wasmtime.Engine, pending: Callable[[], int], period_s: float,
                 on_tick: Callable[[], None] = lambda: None) -> None:
        self._engine, self._pending, self._period_s, self._on_tick = engine, pending, period_s, on_tick
        self._work = threading.Event()
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="aicirt-epoch")
        self._draining = False
        self._guests = 0   # guest code run outside the pool (a start function at instantiation)
        self._lock = threading.Lock()
        self._thread.start()

    @contextlib.contextmanager
    def ticking(self) -> Iterator[None]:
        """Tick while the block runs guest code outside the pool (e.g. instantiation)."""
        with self._lock:
            self._guests += 1
        self._work.set()
        try:
            yield
        finally:
            with self._lock:
                self._guests -= 1

    def kick(self) -> None:
        """Calls were queued: tick until they have all ended."""
        if not self._work.is_set():
            self._work.set()

    def drain(self) -> None:
        """The pool is closing: tick until `close`, whatever the pool says."""
        self._draining = True
        self._work.set()

    def _run(self) -> None:
        while not self.closed.is_set():
            self._work.clear()
            if not (self._draining or self._guests or self._pending()):   # a kick after this sets the event
                self._work.wait()
                continue
            if not self.closed.wait(self._period_s):
                self._engine.increment_epoch()
                self._on_tick()

    def close(self) -> None:
        """Stop ticking; returns once the thread has ended (unless called on it), so that no tick
        reaches an engine freed after this."""
        self.closed.set()
        self._work.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
