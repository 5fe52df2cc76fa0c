"""The server's shared state: settings, store, model backend, engine loop, metrics, compiled
controllers; and the three steps every generation route takes (`prepare` in a worker thread,
`start`, `updates`). Imports the web framework only for `Request`'s disconnect check."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from . import protocol as P
from .loop import Accepted, EngineLoop, Job, Overloaded, Rejected
from .metrics import Metrics
from .settings import Settings
from .store import Store, StoreError, artifact_size, is_module_id, resolve_controller

if TYPE_CHECKING:
    from ..loader.controller import Controller
    from ..engine.backends.base import Backend
    from .tracker import Update


class Server:
    """What the routes share: settings, store, backend, engine loop, metrics, compiled controllers."""

    def __init__(self, settings: Settings, backend: Backend | None = None, store: Store | None = None) -> None:
        from aicirt import Runtime
        from aicirt.engine.backends import load_backend
        from aicirt.engine import Engine
        from aicirt.core.memory import cap_malloc_arenas, pin_malloc_thresholds

        self.settings = settings
        self.store = store or Store(settings.store, max_upload_bytes=settings.max_upload_bytes)
        vllm = None
        if settings.engine == "vllm" and backend is None:
            from aicirt.engine.vllm_engine import VllmEngine

            vllm = VllmEngine(settings.model, tensor_parallel_size=settings.tensor_parallel_size,
                              data_parallel_size=settings.data_parallel_size, max_model_len=settings.max_context,
                              engine_args=json.loads(settings.vllm_args) if settings.vllm_args else None)
            backend = vllm.backend
        self.backend = backend if backend is not None else load_backend(settings.model)
        self.model_name = settings.served_model if backend is None or vllm is not None else (
            settings.model_name or settings.model or backend.name)
        self.context = P.context_length(self.backend, settings.max_context)
        # This process is the server's own: large freed buffers go back to the OS, and its threads
        # share one malloc arena, before the runtime's workers start (registry.py).
        pin_malloc_thresholds()
        cap_malloc_arenas()
        # The runtime's compile cache is the store's modules/ folder: uploads compile once, here.
        runtime = Runtime(self.backend.runtime_tokenizer(), limits=settings.limits, workers=settings.workers,
                          cache_dir=self.store.root, max_sequences=max(1024, settings.max_batch * 17))
        self.runtime = runtime
        self.store._compiler = self._compile
        self.metrics = Metrics()
        if vllm is not None:
            vllm.use_runtime(runtime)
        engine: Any = vllm if vllm is not None else Engine(self.backend, runtime=runtime)   # the same interface
        self.loop = EngineLoop(engine, max_batch=settings.max_batch,
                               max_queue=settings.max_queue, retry_after_s=settings.retry_after_s,
                               metrics=self.metrics)
        self.metrics.gauge("aicirt_queue_depth", lambda: self.loop.queue_depth)
        self.metrics.gauge("aicirt_running_requests", lambda: self.loop.running)
        self.metrics.gauge("aicirt_live_sequences", self.loop.live_sequences)
        self.metrics.gauge("aicirt_worker_pool_saturated", lambda: float(runtime.pool.stats().saturated))
        self.metrics.gauge("aicirt_worker_stalls_total", lambda: float(runtime.pool.stats().stalls_total))
        self.metrics.gauge("aicirt_resident_slot_bytes", lambda: runtime.registry.resident.held_bytes)
        self.metrics.gauge("aicirt_memory_budget_bytes", lambda: runtime.memory_budget.limit_bytes)
        self.metrics.gauge("aicirt_memory_reserved_bytes", lambda: runtime.memory_budget.reserved_bytes)
        self._controllers: dict[str, tuple[tuple, Controller]] = {}
        self._shipped: dict[str, Path] = {}          # shipped controllers' builds (sources fixed under a server)
        self._build_lock = threading.Lock()
        self._lock = threading.Lock()
        self.started = time.time()

    def _compile(self, data: bytes) -> int:
        return artifact_size(self.runtime, self.runtime.load(data))

    def close(self) -> None:
        self.loop.stop()
        self.runtime.close()

    # --- controllers -----------------------------------------------------------------------
    def controller(self, spec: str) -> Controller:
        """The compiled controller a client names (tag, module id, shipped name); cached by file."""
        from aicirt import LoadError
        from aicirt.build.toolchain import BuildError

        try:
            if spec in self._shipped or is_module_id(spec):
                path = resolve_controller(spec, self.store, allow_paths=False, shipped_builds=self._shipped)
            else:
                # A shipped controller's first build: toolchain.build's temp file is per process,
                # so two threads must not build the same one at once.
                with self._build_lock:
                    path = resolve_controller(spec, self.store, allow_paths=False, shipped_builds=self._shipped)
        except StoreError as e:
            raise P.ApiError(e.status, str(e)) from None
        except BuildError as e:
            raise P.ApiError(500, f"building {spec}: {e.message}") from None
        try:
            st = Path(path).stat()
        except FileNotFoundError:
            raise P.ApiError(404, f"controller {spec}: its module file is gone") from None
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = self._controllers.get(str(path))
        if hit is not None and hit[0] == key:
            return hit[1]
        try:
            ctrl = self.runtime.load(path)
        except LoadError as e:
            raise P.ApiError(400, f"controller {spec}: {e}") from None
        with self._lock:
            self._controllers[str(path)] = (key, ctrl)
        return ctrl

    # --- jobs ------------------------------------------------------------------------------
    def prepare(self, body: P._Sampling, prompt_tokens: Callable[[], list[int]],
                default_temperature: float, program: tuple[str, bytes] | None = None) -> Job:
        """Resolve the controller, tokenize, check limits (blocking: call in a worker thread).
        `program`: (controller, argument) to run instead of the body's `controller`."""
        if program is not None:
            return self._job(body, self.controller(program[0]), program[1], prompt_tokens, default_temperature)
        ctrl = self.controller(body.controller) if body.controller else None
        return self._job(body, ctrl, body.arg_bytes(), prompt_tokens, default_temperature)

    def _job(self, body: P._Sampling, ctrl: Controller | None, arg: bytes,
             prompt_tokens: Callable[[], list[int]], default_temperature: float) -> Job:
        tokens = prompt_tokens()
        max_tokens = P.check_length(tokens, body.max_tokens, self.context, self.settings.default_max_tokens)
        try:
            params = body.sampling(max_tokens, default_temperature)
        except ValueError as e:
            raise P.ApiError(400, str(e)) from None
        return Job(prompt=tokens, controller=ctrl, arg=arg, params=params)

    async def start(self, job: Job, request: Request) -> Accepted:
        """Hand `job` to the engine and wait until it is running (or refused: ApiError)."""
        job.bind()
        try:
            self.loop.submit(job)
        except Overloaded as e:
            raise P.ApiError(503, str(e), headers={"Retry-After": str(e.retry_after_s)}) from None
        try:
            while True:
                try:
                    first = await job.next(timeout=0.5)
                    break
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        self.loop.cancel(job)
                        raise P.ApiError(499, "client closed the request") from None
        except asyncio.CancelledError:
            self.loop.cancel(job)
            raise
        if isinstance(first, Rejected):
            raise P.ApiError(first.status, first.message)
        if first is None:
            raise P.ApiError(503, "the request was dropped before it started")
        return first

    async def updates(self, job: Job, request: Request | None = None) -> AsyncIterator[list[Update]]:
        """The job's updates until its end, in lists (all that arrived since the last one);
        cancels the job if the consumer goes away."""
        try:
            while True:
                try:
                    items = await job.next_batch(timeout=0.5 if request is not None else None)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():  # type: ignore[union-attr]  # timeouts only with a request
                        return
                    continue
                batch = []
                for item in items:
                    if item is None:
                        break
                    if isinstance(item, Rejected):   # the engine stopped under the request
                        raise P.ApiError(item.status, item.message)
                    batch.append(item)
                if batch:
                    yield batch
                if len(batch) < len(items):
                    return
        finally:
            self.loop.cancel(job)
