"""The engine thread: one `aicirt.engine.Engine` shared by every HTTP request.

The engine is not thread-safe, so exactly one thread (this loop) touches it. HTTP handlers talk
to it through queues: `submit(job)` puts a job in the inbox (or raises `Overloaded` when the
server already holds `max_batch + max_queue` requests: admission control instead of an
unbounded wait); `cancel(job)` asks for its end. Between two engine steps the loop takes
cancellations (freeing the request's sequences, caches and controllers), admits waiting jobs up
to `max_batch` running ones (they join the running batch at the next step: continuous
batching), steps, and posts each job its `Update` onto the job's asyncio queue.

Every job gets an answer: `Rejected` (its controller failed or refused on its first call, a 400;
the server failed it), or `Accepted` then updates until the one that says finished; then the end.
The loop uses the engine's public API only: `Engine.abort` ends a request, and the engine's
scheduler retires each request with the step that returns its last events.
"""
from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from aicirt.runner.arg_check import first_call_failure
from aicirt.engine import Engine, SamplingParams
from aicirt.errors import failure_message

from .metrics import Metrics
from .tracker import RunTracker


class Overloaded(Exception):
    """The server holds as many requests as it admits; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class Accepted:
    """The request is in the engine: its controller instantiated, the stream may start."""
    created: int


@dataclass
class Rejected:
    """The engine refused the request before it started (a client error: `status` 4xx)."""
    status: int
    message: str


_END = object()        # posted after a job's last update


@dataclass(eq=False)
class Job:
    """One generation request, as an HTTP handler hands it to the loop.

    `prompt`: token ids (the handler tokenized and checked them against the context);
    `controller`: an `aicirt.Controller` or None; `arg`: its argument. Read the loop's answers
    with `await job.next()`: first `Accepted` or `Rejected`, then `Update`s, then None.
    """
    prompt: list[int]
    controller: Any
    arg: bytes
    params: SamplingParams
    id: str = ""
    _outbox: asyncio.Queue = field(default_factory=asyncio.Queue, repr=False)
    _aloop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    req: Any = field(default=None, repr=False)       # the engine's GenRequest, once admitted
    tracker: Any = field(default=None, repr=False)   # its RunTracker, once admitted
    cancelled: bool = False
    accepted: bool = False         # `Accepted` sent: the request survived its first step
    done: bool = False
    submitted_at: float = 0.0

    def bind(self) -> None:
        """Attach to the running asyncio loop (call from the handler, before `submit`)."""
        self._aloop = asyncio.get_running_loop()
        self._outbox = asyncio.Queue()

    async def next(self, timeout: float | None = None) -> Any:
        """The next message; None after the last. Raises `asyncio.TimeoutError` after `timeout`."""
        item = await asyncio.wait_for(self._outbox.get(), timeout)
        return None if item is _END else item

    async def next_batch(self, timeout: float | None = None) -> list:
        """Every message waiting, at least one (a stream that fell behind catches up in one
        write); None marks the end. Raises `asyncio.TimeoutError` after `timeout`."""
        items = [await asyncio.wait_for(self._outbox.get(), timeout)]
        while not self._outbox.empty():
            items.append(self._outbox.get_nowait())
        return [None if item is _END else item for item in items]


def _deliver(batch: list) -> None:
    for job, item in batch:
        job._outbox.put_nowait(item)


class EngineLoop:
    """Owns `engine` on a thread of its own; see the module docstring.

    `max_batch`: requests decoding at once; `max_queue`: requests admitted to wait beyond them.
    """

    def __init__(self, engine: Engine, *, max_batch: int, max_queue: int, retry_after_s: int = 1,
                 metrics: Metrics | None = None):
        self.engine = engine
        self.max_batch, self.max_queue, self.retry_after_s = max_batch, max_queue, retry_after_s
        self.metrics = metrics or Metrics()
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: list[Job] = []
        self._held = 0                     # jobs submitted and not yet finished (all states)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="aicirt-engine", daemon=True)
        self.steps = 0
        self.peak_running = 0              # most requests decoded in one step (benchmarks, tests)
        self._outgoing: list = []          # (job, message) to hand over after this iteration

    # --- from any thread -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End every job, stop the thread, close the engine. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue `job` (call `job.bind()` first). Raises `Overloaded` when the server is full."""
        with self._lock:
            if self._stop.is_set():
                raise Overloaded("the server is shutting down", self.retry_after_s)
            if self._held >= self.max_batch + self.max_queue:
                self.metrics.inc("aicirt_rejected_total", reason="overloaded")
                raise Overloaded(f"the server holds {self._held} requests, its limit "
                                 f"({self.max_batch} running + {self.max_queue} queued)", self.retry_after_s)
            if job.controller is not None and len(self._waiting) >= self.max_queue \
                    and not self.engine.has_memory_for(1):
                self.metrics.inc("aicirt_rejected_total", reason="memory")
                raise Overloaded(f"the memory budget is full and {len(self._waiting)} requests wait for it: "
                                 f"{self.engine.memory_budget_text()}", self.retry_after_s)
            self._held += 1
        job.submitted_at = time.perf_counter()
        self._inbox.put(("add", job))

    def cancel(self, job: Job) -> None:
        """End `job` at the next step boundary (the client went away). Idempotent."""
        if not job.done:
            job.cancelled = True
            self._inbox.put(("cancel", job))

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def live_sequences(self) -> int:
        """Sequences the engine still decodes (read racily: for metrics and tests only)."""
        return sum(1 for j in list(self._running) if j.req is not None
                   for s in list(j.req.sequences) if s.finish_reason is None)

    # --- the engine thread -----------------------------------------------------------------
    def _main(self) -> None:
        failures = 0   # iterations in a row that raised
        try:
            while not self._stop.is_set():
                try:
                    self._drain(block=not self._running and not self._waiting)
                    self._admit()
                    if self._running or self.engine.has_unfinished:   # the latter: aborted requests to retire
                        self._step()
                    failures = 0
                except Exception as e:  # a bug here must not stop the thread every request waits on
                    traceback.print_exc()
                    error = f"internal error: {type(e).__name__}: {e}"
                    self._fail_running(error)
                    failures += 1
                    if failures > 1:   # a fault no running request explains: what waits would wait forever
                        self._fail_waiting(error)
                        self._stop.wait(min(1.0, 0.01 * 2 ** failures))   # and no tight loop on it
                self._flush()
        finally:
            for job in self._running + list(self._waiting):
                self._end(job, "the server is shutting down")
            self._flush()
            self.engine.close()

    def _send(self, job: Job, item: object) -> None:
        self._outgoing.append((job, item))

    def _flush(self) -> None:
        """Hand this iteration's messages over: one wake-up per event loop, not one per message."""
        if not self._outgoing:
            return
        by_loop: dict = {}
        for job, item in self._outgoing:
            by_loop.setdefault(job._aloop, []).append((job, item))
        self._outgoing = []
        for aloop, batch in by_loop.items():
            try:
                aloop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:      # that event loop is gone: nobody is listening
                pass

    def _drain(self, block: bool) -> None:
        """Take every message in the inbox; with `block`, wait for the first one."""
        while True:
            try:
                msg = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if msg is None:
                return
            kind, job = msg
            if kind == "add":
                self._waiting.append(job)
            elif kind == "cancel":
                self._cancel(job)

    def _cancel(self, job: Job) -> None:
        if job.done:
            return
        if job in self._waiting:
            self._waiting.remove(job)
        self.metrics.inc("aicirt_requests_total", outcome="cancelled")
        self._end(job, None)

    def _admit(self) -> None:
        self.engine.collect()   # controllers closed mid-call whose calls ended: memory back, idle or not
        while self._waiting and len(self._running) < self.max_batch:
            job = self._waiting[0]
            if job.cancelled:
                self._waiting.popleft()
                self._end(job, None)
                continue
            # A controlled request waits (in order) while the memory budget has no room for its
            # sequence: running ones end and give theirs back. With nothing running it starts
            # anyway and ends with the budget's error rather than wait for nothing.
            if job.controller is not None and self._running and not self.engine.has_memory_for(1):
                return
            self._waiting.popleft()
            self._start(job)

    def _start(self, job: Job) -> None:
        from aicirt import AicirtError

        try:
            req = self.engine.add_request(job.prompt, job.controller, job.arg, params=job.params, chat=False)
        except (ValueError, AicirtError) as e:
            self._reject(job, 400, str(e))
            return
        job.req = req
        job.tracker = RunTracker(self.engine.backend, req)
        self._running.append(job)
        self.peak_running = max(self.peak_running, len(self._running))
        self.metrics.observe("aicirt_queue_wait_seconds", time.perf_counter() - job.submitted_at)
        if self._failed_to_start(job):         # an engine that spawns eagerly knows already
            return
        # Otherwise `Accepted` waits for the request's first step: a controller that fails to
        # instantiate (or on its first call) gets a 400, not a stream that only says so.

    def _failed_to_start(self, job: Job) -> bool:
        """Reject `job` (400) if its controller failed or refused its argument on its first call,
        before producing anything (`aicirt.runner.arg_check.first_call_failure`); the message leads with
        the controller's own reason (`failure_message`). The engine retires the request itself."""
        req = job.req
        first = req.sequences[0]
        if len(req.sequences) != 1 or first.output_tokens or job.tracker.usage.ff_tokens != len(req.prompt):
            return False
        failed = first_call_failure(first)
        if failed is None:
            return False
        error, log = failed
        self._running.remove(job)
        self._reject(job, 400, failure_message(f"controller failed to start: {error}", log))
        return True

    def _reject(self, job: Job, status: int, message: str) -> None:
        self.metrics.inc("aicirt_requests_total", outcome="rejected")
        self._send(job, Rejected(status, message))
        self._release(job)

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            events = self.engine.step()
        except Exception as e:  # a backend failure: fail the running requests, keep serving
            traceback.print_exc()
            self._fail_running(f"engine step failed: {type(e).__name__}: {e}")
            return
        self.steps += 1
        m = self.metrics
        m.observe("aicirt_step_seconds", time.perf_counter() - t0)
        by_req: dict[int, list] = {}
        for ev in events:
            by_req.setdefault(id(ev.request), []).append(ev)
        finished = []
        # A copy: a job rejected here leaves `_running`, and the job after it must still get its
        # events (iterating the list itself skipped it: a request that ended in that step was
        # retired by the engine and its job never heard, so its client waited forever).
        for job in list(self._running):
            evs = by_req.get(id(job.req))
            if not evs:
                continue
            upd = job.tracker.update(evs)
            if upd is None:
                continue
            if not job.accepted:
                if self._failed_to_start(job):
                    continue
                job.accepted = True
                self._send(job, Accepted(int(time.time())))
            for d in upd.forks:
                if d.finish_reason == "error":
                    m.inc("aicirt_sequence_errors_total")
            self._send(job, upd)
            if upd.finished:
                finished.append(job)
        for job in finished:
            self._finish_ok(job)
        m.set("aicirt_controller_seconds_total", self.engine.stats.controller_s)
        m.set("aicirt_forward_seconds_total", self.engine.stats.forward_s)

    def _fail_waiting(self, error: str) -> None:
        """Answer every request that has not started with a 500 naming `error`."""
        while self._waiting:
            job = self._waiting.popleft()
            if not job.done:
                self._reject(job, 500, error)

    def _fail_running(self, error: str) -> None:
        """End every running request with `error` (streamed to its client); keep serving."""
        self.metrics.inc("aicirt_engine_errors_total")
        for job in list(self._running):
            try:
                self._end(job, error)
            except Exception:
                traceback.print_exc()
                if job in self._running:
                    self._running.remove(job)
                if not job.done:
                    self._send(job, _END)
                    self._release(job)

    def _finish_ok(self, job: Job) -> None:
        u = job.tracker.usage
        self.metrics.inc("aicirt_requests_total", outcome="ok")
        self.metrics.inc("aicirt_tokens_total", u.sampled_tokens, kind="sampled")
        self.metrics.inc("aicirt_tokens_total", u.ff_tokens, kind="ff")
        self._running.remove(job)
        self._send(job, _END)
        self._release(job)

    def _end(self, job: Job, error: str | None) -> None:
        """End a job the engine did not finish: cancelled (`error` None) or failed."""
        if job.done:
            return
        if job in self._running:
            self._running.remove(job)
        if job.req is not None:
            self.engine.abort(job.req, "abort" if error is None else "error")   # retired with the next step
            if error is not None and job.accepted:
                self.metrics.inc("aicirt_requests_total", outcome="failed")
                upd = job.tracker.abort_update()
                for d in upd.forks:
                    d.error = d.error or error
                self._send(job, upd)
            elif error is not None:           # failed before its stream started
                self.metrics.inc("aicirt_requests_total", outcome="failed")
                self._send(job, Rejected(500, error))
        elif error is not None:
            self._send(job, Rejected(503, error))
        self._send(job, _END)
        self._release(job)

    def _release(self, job: Job) -> None:
        job.done = True
        with self._lock:
            self._held -= 1
