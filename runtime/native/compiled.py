"""The hot path: pool.c's worker pool, rows.c's rows API and host.c's native imports and
variables, from the library build.py makes of runtime/native/*.c (cffi ABI mode)."""
from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import wasmtime
from wasmtime import _ffi as wt_ffi

from . import pyrows
from .build import load_extension
from .pool_stats import PoolStats
from .types import CFFI, CData, CLib

if TYPE_CHECKING:
    from . import EditArrays, Native, RowScratch
    from .instance import SpawnPlan


def fn_addr(name: str) -> int:
    """Address of a libwasmtime function, from the copy wasmtime-py loaded."""
    return ctypes.cast(getattr(wt_ffi.dll, name), ctypes.c_void_p).value or 0


# Python host imports nested in one another (a cabi_realloc that calls host imports) fail past this
# depth, while the thread's stack still has room.
MAX_NESTED_IMPORTS = 16


def escaped_text(exc: BaseException, tb: object) -> str:
    """A fault for an exception that escaped a host import's handler, in the handler's own words
    ("host import `name` failed: Type: message"); the name from the handler's frame if it ran."""
    what = "host import"
    while tb is not None:
        what = tb.tb_frame.f_locals.get("what", what)  # type: ignore[attr-defined]
        tb = tb.tb_next  # type: ignore[attr-defined]
    return f"{what} failed: {type(exc).__name__}: {exc}"


class Compiled:
    mode = "compiled"

    def __init__(self, native: "Native") -> None:
        mod = self.library = load_extension()
        self.ffi, self.lib = ffi, lib = mod.ffi, mod.lib
        #: a C pointer into a contiguous numpy array, which the caller keeps alive for the call
        self._from_buffer: Callable[[str, np.ndarray], CData] = ffi.from_buffer
        self._new, self._cast = ffi.new, ffi.cast
        self._size_p, self._uintptr = ffi.typeof("size_t *"), ffi.typeof("uintptr_t")
        size = lib.aicirt_bind(*(ffi.cast("void *", fn_addr(n)) for n in (
            "wasmtime_func_call_unchecked", "wasmtime_memory_data", "wasmtime_memory_data_size",
            "wasmtime_context_set_epoch_deadline", "wasmtime_caller_context", "wasmtime_context_get_data",
            "wasmtime_trap_new", "wasmtime_error_delete")))
        if size != ffi.sizeof("aicirt_slot"):
            raise RuntimeError("aicirt_slot layout differs between slot.c and ffi_decl.py")
        lib.aicirt_bind_clock(ffi.cast("void *", fn_addr("wasmtime_error_new")),
                              ffi.cast("void *", fn_addr("wasmtime_engine_increment_epoch")))
        self._spawn_fns = ffi.new("void *[]", [ffi.cast("void *", fn_addr(n)) for n in (   # spawn.c's order
            "wasmtime_store_new", "wasmtime_store_context", "wasmtime_store_limiter", "wasmtime_store_delete",
            "wasmtime_context_set_data", "wasmtime_store_epoch_deadline_callback", "wasmtime_instance_pre_instantiate",
            "wasmtime_instance_export_get", "wasmtime_memory_grow", "wasmtime_global_get", "wasmtime_global_set")])
        lib.aicirt_bind_spawn(self._spawn_fns)
        # spawn.c copies handles by the sizes of wasmtime 50's C API: checked against wasmtime-py's bindings
        if (ffi.sizeof("wt_instance_t"), ffi.sizeof("wt_extern_t"), ffi.offsetof("wt_extern_t", "of"),
                ffi.sizeof("wt_func_t"), ffi.sizeof("wt_memory_t")) != (
                ctypes.sizeof(wt_ffi.wasmtime_instance_t), ctypes.sizeof(wt_ffi.wasmtime_extern_t),
                wt_ffi.wasmtime_extern_t.of.offset, ctypes.sizeof(wt_ffi.wasmtime_func_t),
                ctypes.sizeof(wt_ffi.wasmtime_memory_t)) \
                or ctypes.sizeof(wt_ffi.wasmtime_global_t) > 24 or ctypes.sizeof(wt_ffi.wasmtime_val_t) > 64:
            raise RuntimeError("wasmtime's C API layouts differ from spawn.c's")
        #: clock.c's epoch-deadline callback, for wasmtime_store_epoch_deadline_callback (its address)
        self.epoch_callback = int(ffi.cast("uintptr_t", lib.aicirt_epoch_cb))
        self.clock_start = lib.aicirt_clock_start
        self.call_cpu_us = lib.aicirt_call_cpu_us

        def on_error(exc_type: type, exc: BaseException, tb: object) -> int:
            # an exception that left the handler: the sequence's fault (cffi would print it and return 0)
            native.set_fault(tb.tb_frame.f_locals["slot"], escaped_text(exc, tb))  # type: ignore[attr-defined]
            return 1

        nesting = threading.local()

        @ffi.callback("int(int32_t, aicirt_slot *, void *, wt_val_raw_t *)", onerror=on_error)
        def py_import(index: int, slot: CData, ctx: CData, args: CData) -> int:   # the GIL is taken by cffi
            depth = nesting.__dict__.get("depth", 0)
            if depth >= MAX_NESTED_IMPORTS:   # fail while the stack has room
                native.set_fault(slot, f"host import failed: RecursionError: host imports nested over "
                                       f"{MAX_NESTED_IMPORTS} deep (a cabi_realloc calling host imports)")
                return 1
            nesting.depth = depth + 1
            try:
                return native.dispatch(index, slot, ctx, args)
            finally:
                nesting.depth = depth

        self._py_import = py_import   # the trampoline lives as long as the process's hot path
        lib.aicirt_bind_py_import(ffi.cast("void *", py_import))
        self.log_append = lambda slot, data: lib.aicirt_log_append(slot, data, len(data))
        self._error_text = native.error_text

    def release(self, slot: CData) -> None:
        """Free the slot's native buffers (its log, the tokens it saw, a trap or wasmtime error no
        one read: a call that ended after its sequence was closed leaves one) and its Store, if
        still held."""
        if slot.trap != self.ffi.NULL or slot.error != self.ffi.NULL:
            self._error_text(slot)      # formats and frees both (~0.3-0.7 KiB each, with a backtrace)
        self.lib.aicirt_store_delete(slot)
        self.lib.aicirt_slot_release(slot)
        self.lib.aicirt_seen_free(slot)

    def store_delete(self, slot: CData) -> None:
        """Free the slot's Store (its instance, its pooled memory slot); idempotent."""
        self.lib.aicirt_store_delete(slot)

    def _plan(self, plan: "SpawnPlan") -> CData:
        """spawn.c's form of `plan` (made once; the C strings are kept with it)."""
        if plan.impl is None:
            ffi = self.ffi
            names = [ffi.new("char[]", n) if n is not None else ffi.NULL for n in plan.names]
            gnames = [ffi.new("char[]", name) for _, name in plan.globals]
            c = ffi.new("aicirt_spawn_plan *")
            c.engine, c.pre = ffi.cast("void *", plan.engine_addr), ffi.cast("void *", plan.pre_addr)
            c.memory_bytes, c.has_post, c.has_init = plan.memory_bytes, plan.has_post, plan.has_init
            for k, (n, raw) in enumerate(zip(names, plan.names)):
                c.names[k], c.lens[k] = n, len(raw or b"")
            c.n_globals = len(gnames)
            garr = ffi.new("const char *[]", gnames or [ffi.NULL])
            glens = ffi.new("size_t[]", [len(name) for _, name in plan.globals] or [0])
            c.global_names, c.global_lens = garr, glens
            plan.impl = (c, names, gnames, garr, glens)   # the struct and what it points at
        return plan.impl[0]

    def spawn(self, plan: "SpawnPlan", slot: CData) -> int:
        """spawn.c's aicirt_spawn: 0, or 1 with the reason in the slot."""
        return self.lib.aicirt_spawn(plan.impl[0] if plan.impl is not None else self._plan(plan), slot)

    def fork_copy(self, plan: "SpawnPlan", src: CData, dst: CData) -> int:
        """spawn.c's aicirt_fork_copy: the pages written, or -1 with the reason in `dst`."""
        assert plan.image is not None
        return self.lib.aicirt_fork_copy(self._plan(plan), src, dst, *plan.image)

    def seen_tokens(self, slot: CData) -> list[int]:
        """The tokens the slot's controller has seen."""
        return self.ffi.unpack(slot.seen, slot.n_seen) if slot.n_seen else []

    def copy_seen(self, src: CData, dst: CData) -> None:
        if self.lib.aicirt_seen_copy(src, dst):
            raise MemoryError("a fork's token list")

    def collect_rows(self, ptrs: np.ndarray, row_status: np.ndarray, kind: np.ndarray, temperature: np.ndarray,
                     elapsed_us: np.ndarray) -> int:
        """rows.c's aicirt_rows_collect over the batch's arrays (see RowKind); returns how many
        rows are not RowKind.MASK."""
        fb = self._from_buffer
        return self.lib.aicirt_rows_collect(fb("aicirt_slot *[]", ptrs), len(ptrs), fb("int8_t[]", row_status),
                                            fb("uint8_t[]", kind), fb("float[]", temperature),
                                            fb("double[]", elapsed_us))

    def gather_rows(self, table: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, int]:
        """(table[index], -1), or (_, row) for the first row whose index is no live entry."""
        fb, out = self._from_buffer, np.empty(len(index), dtype=np.uint64)
        rc = self.lib.aicirt_rows_gather(fb("uint64_t[]", table), len(table), fb("int64_t[]", index), len(index),
                                         fb("uint64_t[]", out))
        return out, -rc - 1

    def make_pool(self, workers: int, max_workers: int, stall_s: float, steal: bool,
                  engine: wasmtime.Engine, tick_s: float) -> "CPool":
        return CPool(self.ffi, self.lib, workers, max_workers, stall_s, steal, engine, tick_s)

    def memory(self, slot: CData) -> tuple[int, int]:
        """(address, size) of the slot's linear memory."""
        size = self._new(self._size_p)   # C types resolved once (a spawn and a close each call this)
        ptr = self.lib.aicirt_memory(slot, size)
        return int(self._cast(self._uintptr, ptr)), size[0]

    def ctx_memory(self, slot: CData, ctx: CData) -> tuple[int, int]:
        size = self.ffi.new("size_t *")
        ptr = self.lib.aicirt_ctx_memory(slot, ctx, size)
        return int(self.ffi.cast("uintptr_t", ptr)), size[0]

    def ctx_alloc(self, slot: CData, ctx: CData, align: int, n: int, name: str) -> int:
        return self.lib.aicirt_ctx_alloc(slot, ctx, align, n, name.encode())

    def check_mask(self, mem: int, size: int, ptr: int, words: int, vocab_size: int, row: int) -> tuple[int, int, int]:
        """The mask rule (step.c's aicirt_check_mask): copies into `row`; (status, detail0, detail1)."""
        d = self.ffi.new("uint32_t[2]")
        st = self.lib.aicirt_check_mask(self.ffi.cast("uint8_t *", mem), size, ptr, words, vocab_size,
                                        self.ffi.cast("uint32_t *", row), d)
        return st, d[0], d[1]

    def host_callback(self, index: int, native_ok: bool) -> tuple[int, bool]:
        """(callback address, whether it takes a Python handler id as env) for host import `index`."""
        cb = self.lib.aicirt_host_callback(index if native_ok else -1)
        return int(self.ffi.cast("uintptr_t", cb)), not native_ok

    def wasi_callback(self, name: str) -> int:
        """wasi.c's native callback for WASI function `name` (no env), or 0: the Python shim."""
        return int(self.ffi.cast("uintptr_t", self.lib.aicirt_wasi_callback(name.encode())))

    def new_vars(self, limit: int) -> "CVars":
        return CVars(self.ffi, self.lib, limit)


class CPool:
    """pool.c's pthread worker pool: submit slots, wait for their `done` flags (GIL released).
    `workers` run at normal priority; a worker stalled past `stall_s` lowers its priority and is
    replaced, up to `max_workers` threads in all (pool.c explains). With `steal`, a waiting
    caller runs the calls of its own rows that no worker has taken, where pool.c's caller-runs
    rule allows. Its epoch clock, a pthread too, ticks `engine` every `tick_s` while calls are
    out (or while a `ticking` block runs), so that no Python thread wakes per step."""

    def __init__(self, ffi: CFFI, lib: CLib, workers: int, max_workers: int, stall_s: float,
                 steal: bool, engine: wasmtime.Engine, tick_s: float) -> None:
        self.ffi, self.lib = ffi, lib
        self._from_buffer: Callable[[str, np.ndarray], CData] = ffi.from_buffer
        # rows.c's aicirt_rows_submit reads its inputs from this struct; each field is written only
        # when it changed since the last submit (see rows.c: a libffi call's arguments cost more
        # than its work). The views its pointers come from are kept beside it: the index and
        # sampled arrays last submitted (an engine that fills the same arrays every step has them
        # wrapped once; a view keeps its array alive), the scratch buffer, the mask array.
        self._args = ffi.new("aicirt_rows_args *")
        self._args_edits = self._args_seen = False
        self._args_scratch: CData = None
        self._args_masks: np.ndarray | None = None
        self._args_words = -1
        self._last_index: np.ndarray | None = None
        self._last_sampled: np.ndarray | None = None
        self._index_c: CData = None
        self._sampled_c: CData = None
        self._engine = engine   # the clock ticks it until close: kept alive until then
        self._table: np.ndarray | None = None   # the registry's table last submitted from, and its C view
        self._table_c: CData = ffi.NULL
        self._masks_c: dict[int, tuple[np.ndarray, CData]] = {}   # mask arrays last submitted into, and their C views
        self._types = {c: ffi.typeof(c) for c in ("int32_t[]", "int64_t[]", "uint32_t[]")}
        engine_addr = ctypes.cast(engine.ptr(), ctypes.c_void_p).value or 0
        self.ptr = lib.aicirt_pool_new(workers, max_workers, stall_s * 1e6, ffi.cast("void *", engine_addr),
                                       tick_s * 1e6)
        if self.ptr == ffi.NULL:
            raise RuntimeError("could not start controller worker threads")
        self._args.pool = self.ptr
        if not steal:
            lib.aicirt_pool_steal(self.ptr, 0)
        # pyrows.c where it builds: submit_rows in C (an instance attribute over the method below)
        # and finish_rows's C part, bound to this pool's struct and rows.c's functions
        self._finish: Callable[..., int] = self._finish_cffi
        fast = pyrows.load()
        if fast is not None:
            addr = lambda p: int(ffi.cast("uintptr_t", p))   # noqa: E731
            self.submit_rows = fast.submitter(addr(self._args), addr(lib.aicirt_rows_submit))  # type: ignore[method-assign]
            self._finish = fast.finisher(addr(self.ptr), addr(lib.aicirt_rows_finish))

        # Held across the C calls other threads make (a metrics scrape's `stats`, `pending`) and
        # while `close` takes the pointer: without it such a call could lock the mutex of a pool
        # being freed (heap corruption; seen when a Runtime closed right after it started, while
        # a Python epoch thread made its first check). Not held across the free itself, which
        # waits for running calls.
        self._lock = threading.Lock()

    def submit_rows(self, table: np.ndarray, index: np.ndarray, sampled: np.ndarray, edits: "EditArrays | None",
                    masks: np.ndarray, words: int, stamp: int, scratch: "RowScratch",
                    expect_seen: np.ndarray | None = None) -> tuple[int, CData]:
        """rows.c's aicirt_rows_submit (the slots from `table`, then aicirt_rows_start) into
        `scratch`: (how many rows started, its buffer as the hot path holds it), or (-(row + 1), _)
        with nothing started and scratch.row_status[row] saying why (5: no live sequence at that
        index, else aicirt_rows_start's misuse; `expect_seen`: int32 per row, see aicirt_rows_start)."""
        ffi, fb, t, a = self.ffi, self._from_buffer, self._types, self._args   # C types resolved once
        keep: list[CData] = []   # this call's own views: alive until the call returns
        if edits is not None:
            keep += (fb(t["int32_t[]"], edits.of_row), fb(t["int64_t[]"], edits.offsets),
                     fb(t["uint32_t[]"], edits.tokens) if len(edits.tokens) else ffi.NULL,
                     fb(t["uint32_t[]"], edits.unchanged))
            a.edit_of, a.edit_off, a.edit_tok, a.edit_unchanged = keep
            self._args_edits = True
        elif self._args_edits:
            a.edit_of = a.edit_off = a.edit_tok = a.edit_unchanged = ffi.NULL
            self._args_edits = False
        if expect_seen is not None:
            keep.append(fb(t["int32_t[]"], expect_seen))
            a.expect_seen = keep[-1]
            self._args_seen = True
        elif self._args_seen:
            a.expect_seen = ffi.NULL
            self._args_seen = False
        buf = scratch.held
        if buf is None:
            buf = scratch.held = fb("uint8_t[]", scratch.buf)
        if buf is not self._args_scratch:
            a.scratch = self._args_scratch = buf
        if table is not self._table:   # the registry's table is replaced only when it grows
            self._table, self._table_c = table, fb("uint64_t[]", table)
            a.table, a.table_len = self._table_c, len(table)
        if masks is not self._args_masks:   # the registry hands out the same two mask views in turn
            masks_c = self._masks_c.get(id(masks))
            if masks_c is None or masks_c[0] is not masks:
                if len(self._masks_c) >= 4:
                    self._masks_c.clear()
                masks_c = self._masks_c[id(masks)] = (masks, fb("uint32_t[]", masks))
            a.mask_base = masks_c[1]
            self._args_masks = masks
        if words != self._args_words:
            a.words = self._args_words = words
        if index is not self._last_index:   # the engine's own arrays, filled in place: not wrapped again
            self._last_index, self._index_c = index, fb(t["int64_t[]"], index)
            a.index = self._index_c
        if sampled is not self._last_sampled:
            self._last_sampled, self._sampled_c = sampled, fb(t["int32_t[]"], sampled)
            a.sampled = self._sampled_c
        rc = self.lib.aicirt_rows_submit(a, scratch.n, stamp)
        del keep
        return rc, buf

    def finish_rows(self, scratch: "RowScratch", held: CData, timeout_s: float, closed: bool) -> int:
        """rows.c's aicirt_rows_finish over `scratch` (`held`: its buffer from submit_rows): wait
        for the rows' calls (not when `closed`, or once the pool is), then collect;
        scratch.blocked_us says how long it waited. Returns how many rows are not RowKind.MASK."""
        return self._finish(scratch, held, timeout_s, closed or self.ptr is None)

    def _finish_cffi(self, scratch: "RowScratch", held: CData, timeout_s: float, closed: bool) -> int:
        return self.lib.aicirt_rows_finish(self.ffi.NULL if closed else self.ptr, held, scratch.n, timeout_s * 1e6)

    def wait_rows(self, ptrs: np.ndarray, row_status: np.ndarray, timeout_s: float) -> int:
        """Block until every row of `ptrs` (uint64 slot addresses) whose call is out (RowStatus
        STARTED or LATE) is done, or `timeout_s` passes; returns how many are not done."""
        fb = self._from_buffer
        return self.lib.aicirt_rows_wait(self.ptr, fb("aicirt_slot *[]", ptrs), len(ptrs), fb("int8_t[]", row_status),
                                         timeout_s * 1e6)

    @contextlib.contextmanager
    def ticking(self) -> Iterator[None]:
        """The epoch clock ticks while the block runs guest code outside the pool (e.g. an init
        export at load), as it does while calls are out."""
        with self._lock:
            if self.ptr is None:
                raise ValueError("the worker pool is closed")
            self.lib.aicirt_pool_guests(self.ptr, 1)
        try:
            yield
        finally:
            with self._lock:
                if self.ptr is not None:
                    self.lib.aicirt_pool_guests(self.ptr, -1)

    @property
    def pending(self) -> int:
        """Calls running or queued (0 once closed)."""
        with self._lock:
            return self.lib.aicirt_pool_pending(self.ptr) if self.ptr is not None else 0

    @property
    def threads(self) -> int:
        """Workers alive now: the base ones plus any started in place of stalled ones (0 once closed)."""
        with self._lock:
            return self.lib.aicirt_pool_threads(self.ptr) if self.ptr is not None else 0

    @property
    def steals(self) -> int:
        """Calls run on a waiting caller's thread so far (the caller-runs rule; 0 once closed)."""
        with self._lock:
            return self.lib.aicirt_pool_steal(self.ptr, -1) if self.ptr is not None else 0

    def stats(self) -> PoolStats:
        """The pool now (see PoolStats)."""
        out = self.ffi.new("int[6]")
        with self._lock:
            if self.ptr is None:
                return PoolStats(0, 0, 0, 0, 0, False, 0)
            saturated = self.lib.aicirt_pool_stats(self.ptr, out)
        return PoolStats(out[0], out[1], out[2], out[3], out[4], bool(saturated), out[5])

    def close(self) -> None:
        """Stop the workers (waits for running calls, the epoch clock ticking), then the clock."""
        with self._lock:   # once taken, no other thread can reach the pool
            ptr, self.ptr = self.ptr, None
        if ptr is not None:
            self.lib.aicirt_pool_free(ptr)


class CVars:
    """A request's variables in host.c (shared by its forks' worker threads; mutex inside).

    `held` is what they take in native memory, as Limits.variable_bytes counts it (host.c's
    accounting); the changes not yet taken are coalesced per name, so they add nothing to it."""

    def __init__(self, ffi: CFFI, lib: CLib, limit: int) -> None:
        self.ffi, self.lib, self.limit = ffi, lib, limit
        self.ptr = lib.aicirt_vars_new(limit)
        if self.ptr == ffi.NULL:
            raise MemoryError("request variables")

    @property
    def held(self) -> int:
        """Bytes of native memory the variables take (names, values, tables; malloc overhead included)."""
        return self.lib.aicirt_vars_held(self.ptr)

    def get(self, name: str) -> bytes | None:
        ffi = self.ffi
        raw = name.encode("utf-8")
        copy, n = ffi.new("uint8_t **"), ffi.new("uint32_t *")
        rc = self.lib.aicirt_vars_get(self.ptr, raw, len(raw), copy, n)
        if rc < 0:
            raise MemoryError("request variables")
        if rc == 0:
            return None
        try:
            return bytes(ffi.buffer(copy[0], n[0]))
        finally:
            self.lib.aicirt_free(copy[0])

    def set(self, seq_id: int, name: str, value: bytes, append: bool) -> None:
        """Raises ValueError over Limits.variable_bytes, MemoryError out of host memory."""
        raw = name.encode("utf-8")
        would = self.ffi.new("uint64_t *")
        rc = self.lib.aicirt_vars_set(self.ptr, seq_id, raw, len(raw), value, len(value), int(append), would)
        if rc > 0:
            raise ValueError(f"variables would take {would[0]} bytes, over the limit of {self.limit} "
                             f"(Limits.variable_bytes)")
        if rc < 0:
            raise MemoryError("request variables")

    def _records(self, take: "Callable[[CData, CData, CData], int]") -> list[tuple[int, str, str, bytes]]:
        """host.c's record buffer, read in one copy."""
        ffi = self.ffi
        out, nbytes = ffi.new("uint8_t **"), ffi.new("uint64_t *")
        n = take(self.ptr, out, nbytes)
        if n < 0:
            raise MemoryError("request variables")
        if n == 0:
            return []
        try:
            data = bytes(ffi.buffer(out[0], nbytes[0]))
        finally:
            self.lib.aicirt_free(out[0])
        return parse_records(data, n)

    def take_changes(self) -> list[tuple[int, str, str, bytes]]:
        return self._records(self.lib.aicirt_vars_take)

    def snapshot(self) -> dict[str, bytes]:
        return {name: value for _, _, name, value in self._records(self.lib.aicirt_vars_snapshot)}

    def close(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            self.lib.aicirt_vars_free(ptr)


_HEAD = struct.Struct("<4I")


def parse_records(data: bytes, n: int) -> list[tuple[int, str, str, bytes]]:
    """host.c's records: (seq_id, "set" | "append", name, value), `n` of them."""
    out = []
    off, head = 0, _HEAD.unpack_from
    for _ in range(n):
        seq_id, append, nlen, vlen = head(data, off)
        off += 16
        name = data[off:off + nlen].decode("utf-8")
        off += nlen
        out.append((seq_id, "append" if append else "set", name, data[off:off + vlen]))
        off += vlen
    return out
