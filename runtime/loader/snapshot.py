"""Init snapshots: a controller's per-tokenizer work done once per (controller, tokenizer).

A controller may export ``aicirt_init`` (core type ``() -> ()``, :data:`~aicirt.loader.controller.INIT_EXPORT`).
When it does, :func:`load_initialized` runs it once on a *template* instance (after `_initialize`),
under the init rules (docs/snapshots.md):

- it may call the tokenizer-level host imports: `vocab-size`, `eos-token`, `token-trie`,
  `tokenize`, `detokenize`, and `log` (kept for the load error, if any); WASI as for a request
  (runtime/host/wasi.py), except that output goes to that same load log, clocks read zero and the
  random stream is seeded from an empty argument;
- `arg` gives what the module itself fixes of every request's argument, where its init depends on
  it: a js script bound with ``aici.init`` (:func:`aicirt.loader.js_bind.runs_in_init`), whose snapshot is
  then keyed by the module's own sha256; for every other module it is empty;
- it may not call `self-seq-id`, `capabilities`, `var-get`, `var-set`, `var-append`:
  there is no request and no sequence yet. Doing so, trapping, or running past the compile time
  limit (Limits.compile_timeout_s, wall clock) refuses the load with a LoadError naming why.

Then the template's linear memory and mutable globals are written into a new module
(:func:`aicirt.loader.wasm_binary.snapshot_module`: data segments, the memory's minimum, the globals'
initializers; `_initialize`, `aicirt_init` and any start function removed, so wasi-libc's
`_initialize` guard and ctors never run twice). wasmtime maps that module's memory image
copy-on-write, so every request starts from the initialized state at the cost of a plain
instantiation. The compiled snapshot is cached in this process and on disk, keyed by the module's
sha256, the tokenizer's identity (:func:`tokenizer_identity`), the engine key and the memory limit.
Fork is unaffected: the snapshot keeps the loader's exports of every mutable global.
"""
from __future__ import annotations

import ctypes
import hashlib
import struct
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import numpy as np
import wasmtime

from .. import abi
from ..host import wasi
from .controller import (_RULES, INIT_EXPORT, Controller, Source, _compiled, _recall, keep_artifact,
                         load_controller, read_source, validate)
from ..errors import LoadError
from ..limits import Limits
from ..native.traps import summarize_trap
from .js_bind import runs_in_init, split_arg_prefix
from .wasm_binary import WasmFormatError, export_mutable_globals, snapshot_module

if TYPE_CHECKING:
    from ..host.tokenizer import Tokenizer

#: Bumped whenever what a snapshot holds or how it is made changes (then cached ones are stale).
SNAPSHOT_FORMAT = 2
#: A failed init is remembered this long per (module, tokenizer): loads in the meantime fail at
#: once with its error instead of running it again (an init may run up to the compile time limit).
INIT_FAILURE_TTL_S = 30.0
_now = time.monotonic    # the failures' clock (a test moves it on)
#: Host imports an init may call; the others are per request or per sequence.
INIT_IMPORTS = ("vocab-size", "eos-token", "token-trie", "tokenize", "detokenize", "log")
_LOG_CAP = 4096          # bytes of the init's log quoted in a load error


def tokenizer_identity(tokenizer: "Tokenizer") -> str:
    """A digest of everything an init can learn from the tokenizer: its class, vocabulary size,
    EOS id, every token's bytes, and (for a Hugging Face adapter) its full definition, which
    `tokenize` follows. 16 hex digits; ~50 ms at 150k tokens."""
    h = hashlib.sha256()
    h.update(f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}"
             f"|{int(tokenizer.vocab_size)}|{tokenizer.eos_token_id}|".encode())
    for b in tokenizer.token_bytes:
        h.update(struct.pack("<I", len(b)))
        h.update(b)
    to_str = getattr(getattr(tokenizer, "tk", None), "to_str", None)
    if callable(to_str):
        h.update(str(to_str()).encode())
    return h.hexdigest()[:16]


class RememberedFailures:
    """Failure messages remembered per key for `ttl_s` seconds of `clock` (read at each call, so
    that a test can move it on): a failed init per (module, tokenizer) here, a failed prepare per
    argument in aicirt.core.prepared. Callers hold their own lock."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self.ttl_s, self._clock = ttl_s, clock
        self._items: dict[tuple, tuple[float, Any]] = {}

    def put(self, key: tuple, what: Any) -> None:
        self._items[key] = (self._clock(), what)

    def get(self, key: tuple) -> tuple[float, Any] | None:
        """(seconds since it failed, what was put) if it failed less than `ttl_s` ago."""
        now = self._clock()
        for k in [k for k, (at, _) in self._items.items() if now - at >= self.ttl_s]:
            del self._items[k]
        hit = self._items.get(key)
        return None if hit is None else (now - hit[0], hit[1])

    def clear(self) -> None:
        self._items.clear()


@dataclass
class InitHost:
    """What an init sees of the host: the tokenizer, its serialized token trie (built lazily by
    the runtime) and the tokenizer's identity (computed once, on the first snapshot)."""
    tokenizer: "Tokenizer"
    trie: Callable[[], bytes]
    eos_token: int
    _identity: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: snapshot key -> its module in this engine: a controller loaded again (an engine given a
    #: path per request) reuses it instead of deserializing megabytes again (~12 ms for json).
    modules: dict[tuple, wasmtime.Module] = field(default_factory=dict)
    #: snapshot key -> its LoadError's message: not re-run for INIT_FAILURE_TTL_S
    failures: RememberedFailures = field(default_factory=lambda: RememberedFailures(INIT_FAILURE_TTL_S,
                                                                                    lambda: _now()))

    def failed_before(self, key: tuple) -> str | None:
        """The message of this key's init failure if it failed less than INIT_FAILURE_TTL_S ago."""
        with self._lock:
            hit = self.failures.get(key)
        if hit is None:
            return None
        return (f"{hit[1]} (remembered: this init failed {hit[0]:.0f} s ago for this tokenizer; "
                f"it is not run again before {INIT_FAILURE_TTL_S:g} s have passed)")

    def remember_failure(self, key: tuple, message: str) -> None:
        with self._lock:
            self.failures.put(key, message)

    def forget(self) -> None:
        """Drop the modules (the Runtime closed: they would keep its wasmtime Engine alive)."""
        self.modules.clear()

    @property
    def identity(self) -> str:
        with self._lock:
            if self._identity is None:
                self._identity = tokenizer_identity(self.tokenizer)
            return self._identity


class _InitBroke(Exception):
    """The init broke a rule, or a host import it called failed: the message says which."""


class _Template:
    """One template instance's host: Python callbacks (load-time only, a handful of calls), the
    init's log, and the first rule it broke (kept here, never in wasmtime's error slot)."""

    def __init__(self, host: InitHost, arg_cap: int, arg: bytes = b"") -> None:
        self.host, self.arg_cap, self.arg = host, arg_cap, arg
        self.log = bytearray()
        self.broke: str | None = None
        self.rng = 0   # WASI random_get's stream (runtime/host/wasi.py)

    def fail(self, message: str) -> None:
        if self.broke is None:
            self.broke = message
        raise _InitBroke(message)

    # -- guest memory ---------------------------------------------------------------------------
    def _mem(self, caller: wasmtime.Caller) -> tuple[int, int]:
        memory = caller["memory"]
        assert isinstance(memory, wasmtime.Memory)    # the loader checked the export
        return ctypes.cast(memory.data_ptr(caller), ctypes.c_void_p).value or 0, memory.data_len(caller)

    def read(self, caller: wasmtime.Caller, what: str, ptr: int, n: int) -> bytes:
        ptr, n = ptr & 0xFFFFFFFF, n & 0xFFFFFFFF
        if n > self.arg_cap:
            self.fail(f"host import `{what}`: an argument of {n} bytes is over the limit of {self.arg_cap}")
        base, size = self._mem(caller)
        if ptr + n > size:
            self.fail(f"host import `{what}`: range [{ptr}, {ptr + n}) is outside linear memory ({size} bytes)")
        return ctypes.string_at(base + ptr, n)

    def write(self, caller: wasmtime.Caller, what: str, ptr: int, data: bytes) -> None:
        ptr &= 0xFFFFFFFF
        base, size = self._mem(caller)
        if ptr + len(data) > size:
            self.fail(f"host import `{what}`: range [{ptr}, {ptr + len(data)}) is outside linear memory")
        ctypes.memmove(base + ptr, data, len(data))

    def return_list(self, caller: wasmtime.Caller, what: str, retptr: int, data: bytes, align: int, n: int) -> None:
        realloc = caller[abi.EXPORT_REALLOC]
        assert isinstance(realloc, wasmtime.Func)
        ptr = realloc(caller, 0, 0, align, len(data)) & 0xFFFFFFFF if data else 0
        if data:
            self.write(caller, what, ptr, data)
        self.write(caller, what, retptr, struct.pack("<II", ptr, n))

    # -- the imports --------------------------------------------------------------------------
    def host_import(self, name: str) -> Callable[..., Any]:
        tok = self.host.tokenizer
        if name == "arg":   # the bound script, where the init depends on it (init_arg), else empty
            def arg(caller: wasmtime.Caller, ret: int) -> None:
                self.return_list(caller, name, ret, self.arg, 1, len(self.arg))
            return arg
        if name not in INIT_IMPORTS:
            def refused(caller: wasmtime.Caller, *_: int) -> None:
                self.fail(f"`{INIT_EXPORT}` called host import `{name}`, which init may not call: it runs once per "
                          f"tokenizer, before any request (no argument, no sequence, no variables yet); "
                          f"call it from mid-process")
            return refused
        if name == "vocab-size":
            return lambda caller: int(tok.vocab_size)
        if name == "eos-token":
            return lambda caller: self.host.eos_token
        if name == "token-trie":
            def token_trie(caller: wasmtime.Caller, ret: int) -> None:
                data = self.host.trie()
                self.return_list(caller, name, ret, data, 1, len(data))
            return token_trie
        if name == "log":
            def log(caller: wasmtime.Caller, ptr: int, n: int) -> None:
                self.log += self.read(caller, name, ptr, n)
                del self.log[:-_LOG_CAP]
            return log
        if name == "tokenize":
            def tokenize(caller: wasmtime.Caller, ptr: int, n: int, ret: int) -> None:
                raw = self.read(caller, name, ptr, n)
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    self.fail(f"host import `{name}`: string is not valid UTF-8")
                ids = tok.encode(text)
                self.return_list(caller, name, ret, struct.pack(f"<{len(ids)}I", *ids), 4, len(ids))
            return tokenize

        def detokenize(caller: wasmtime.Caller, ptr: int, n: int, ret: int) -> None:
            ids = struct.unpack(f"<{n & 0xFFFFFFFF}I", self.read(caller, name, ptr, n * 4))
            bad = [t for t in ids if t >= tok.vocab_size]
            if bad:
                self.fail(f"host import `{name}`: token id {bad[0]} >= vocab size {tok.vocab_size}")
            data = tok.decode_bytes(ids)
            self.return_list(caller, name, ret, data, 1, len(data))
        return detokenize

    def wasi_import(self, name: str, ty: wasmtime.FuncType) -> Callable[..., Any]:
        """runtime/host/wasi.py's function, as for a request: clocks read zero (no call yet), the
        random stream is seeded from an empty argument, output goes to the load's log."""
        impl = wasi.function(name, [str(r) for r in ty.results] == ["i32"])

        def call(caller: wasmtime.Caller, *args: int) -> Any:
            return impl(_TemplateIO(self, caller, name), *(a & 0xFFFFFFFF for a in args))
        return call


class _TemplateIO:
    """wasi.WasiIO over a template instance's caller (an init: no request, no call count)."""

    def __init__(self, template: _Template, caller: wasmtime.Caller, name: str) -> None:
        self.t, self.caller, self.name, self.arg_cap = template, caller, name, template.arg_cap

    def read(self, ptr: int, n: int) -> bytes:
        return self.t.read(self.caller, self.name, ptr, n)

    def write(self, ptr: int, data: bytes) -> None:
        self.t.write(self.caller, self.name, ptr, data)

    def fail(self, message: str) -> NoReturn:
        self.t.fail(f"`{INIT_EXPORT}`: {message}")
        raise AssertionError("unreachable")   # fail raises

    def log(self, data: bytes) -> None:
        self.t.log += data
        del self.t.log[:-_LOG_CAP]

    def calls(self) -> int:
        return 0

    def arg(self) -> bytes:
        return b""

    def rng(self) -> int:
        return self.t.rng

    def set_rng(self, state: int) -> None:
        self.t.rng = state

    def call_log(self) -> bytes:
        return bytes(self.t.log)


def _linker(engine: wasmtime.Engine, template: _Template, ctrl: Controller) -> wasmtime.Linker:
    linker = wasmtime.Linker(engine)
    i32 = wasmtime.ValType.i32()
    for name, (params, results) in abi.HOST_IMPORTS.items():
        ty = wasmtime.FuncType([i32] * len(params), [i32] * len(results))
        linker.define_func(abi.HOST_MODULE, name, ty, template.host_import(name), access_caller=True)
    for name, ty in ctrl.wasi_imports:
        linker.define_func(abi.WASI_MODULE, name, ty, template.wasi_import(name, ty), access_caller=True)
    return linker


#: The zero test's granularity (bytes): a snapshot segment starts and ends on a non-zero byte,
#: and zero gaps shorter than `_MERGE_GAP` bytes stay inside a segment (a segment's header costs
#: about 10 bytes). Past `_MAX_SEGMENTS` the gap to merge doubles until they fit (wasmparser
#: takes at most 100,000 data segments).
_CHUNK = 64
_MERGE_GAP = 64
_MAX_SEGMENTS = 10_000


def written_runs(memory: np.ndarray) -> list[tuple[int, bytes]]:
    """(offset, bytes) of the non-zero bytes of `memory` (uint8, a multiple of 64 bytes long), as
    few segments as fit: the data a snapshot stores. What an init wrote, not the pages around it:
    one byte written in each 64 KiB page of a 64 MiB memory is 1,024 segments of one byte each
    (64 MiB before, as whole 64 KiB blocks, which wasmtime then compiled into one 64 MiB image).
    Reads `memory` in place; copies only the runs."""
    chunks = memory.view(np.uint64).reshape(-1, _CHUNK // 8).any(axis=1)
    used = np.flatnonzero(chunks)
    if not len(used):
        return []
    gap = _MERGE_GAP // _CHUNK
    while True:
        breaks = np.flatnonzero(np.diff(used) > gap + 1)
        if len(breaks) < _MAX_SEGMENTS:
            break
        gap = gap * 2 + 1
    starts = np.concatenate(([used[0]], used[breaks + 1])) * _CHUNK
    ends = (np.concatenate((used[breaks], [used[-1]])) + 1) * _CHUNK
    runs = []
    for start, end in zip(starts.tolist(), ends.tolist()):
        data = memory[start:end].tobytes()
        body = data.lstrip(b"\0")
        start += len(data) - len(body)
        runs.append((start, body.rstrip(b"\0")))
    return runs


def run_init(engine: wasmtime.Engine, ctrl: Controller, host: InitHost, limits: Limits) -> tuple[bytes, dict[int, Any]]:
    """Instantiate `ctrl` as a template, run `_initialize` (if exported) then the init export,
    and return its linear memory and its mutable globals' values (index -> value). Needs the
    engine's epoch clock running (a Runtime's). Raises LoadError for a broken rule, a trap or
    an init past Limits.compile_timeout_s."""
    return _run_init(engine, ctrl, host, limits, lambda memory: memory.tobytes())


def run_init_sparse(engine: wasmtime.Engine, ctrl: Controller, host: InitHost, limits: Limits
                    ) -> tuple[tuple[int, list[tuple[int, bytes]]], dict[int, Any]]:
    """:func:`run_init`, returning the memory as (size in bytes, :func:`written_runs`) without
    copying the whole of it (a 64 MiB memory whose init wrote a page costs a page)."""
    return _run_init(engine, ctrl, host, limits, lambda memory: (len(memory), written_runs(memory)))


def _run_init(engine: wasmtime.Engine, ctrl: Controller, host: InitHost, limits: Limits,
              take: Callable[[np.ndarray], Any]) -> tuple[Any, dict[int, Any]]:
    template = _Template(host, limits.host_arg_bytes, init_arg(ctrl))
    store = wasmtime.Store(engine)
    step = "instantiating"
    try:
        store.set_limits(memory_size=limits.memory_bytes)
        store.set_epoch_deadline(limits.ticks(limits.compile_timeout_s))
        instance = _linker(engine, template, ctrl).instantiate(store, ctrl.module)
        ex = instance.exports(store)
        for step in (abi.EXPORT_INITIALIZE, INIT_EXPORT):
            if step == INIT_EXPORT or ctrl.has_initialize:
                func = ex[step]
                assert isinstance(func, wasmtime.Func)
                func(store)
        memory = ex["memory"]
        assert isinstance(memory, wasmtime.Memory)
        base = ctypes.cast(memory.data_ptr(store), ctypes.c_void_p).value or 0
        size = memory.data_len(store)
        data = take(np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(base)) if size
                    else np.zeros(0, np.uint8))
        values = {}
        for idx, gname in ctrl.globals.items():
            g = ex[gname]
            assert isinstance(g, wasmtime.Global)
            values[idx] = g.value(store)
        return data, values
    except Exception as e:  # a trap, an epoch deadline, or a rule the template recorded
        why = template.broke or _trap_text(e, limits)
        log = template.log.decode("utf-8", "replace").strip()
        raise LoadError(f"{ctrl.name}: `{step}` (per-tokenizer init, run at load) failed: {why}"
                        + (f"; its log: {log[-400:]}" if log else "")) from None
    finally:
        store.close()


def _trap_text(e: Exception, limits: Limits) -> str:
    text = str(e).strip()
    if "interrupt" in text:
        return f"it ran past the time limit of {limits.compile_timeout_s:g} s (Limits.compile_timeout_s)"
    return summarize_trap(text) if text else type(e).__name__


def init_arg(ctrl: Controller) -> bytes:
    """What the init's `arg` gives: a bound script that calls ``aici.init``, else nothing."""
    return ctrl.arg_prefix if ctrl.arg_prefix and runs_in_init(ctrl.arg_prefix) else b""


def load_initialized(engine: wasmtime.Engine, engine_key: str, src: Source, host: InitHost, limits: Limits,
                     cache_dir: Path | None) -> Controller:
    """:func:`~aicirt.loader.controller.load_controller`, then, for a controller with an init export,
    the controller whose module starts from its init snapshot for `host`'s tokenizer (made once
    and cached, see the module docstring). Raises LoadError naming what is wrong."""
    data, name = read_source(src, limits.upload_bytes)
    ctrl = load_controller(engine, engine_key, data, max_bytes=limits.upload_bytes,
                           compile_timeout_s=limits.compile_timeout_s, cache_dir=cache_dir,
                           memory_bytes=limits.memory_bytes, name=name)
    if not ctrl.has_init:
        return ctrl
    tag = f"{host.identity}-s{SNAPSHOT_FORMAT}"
    # a bound script shares its code's snapshot, unless the init evaluates it (init_arg)
    of = ctrl.sha256 if init_arg(ctrl) else ctrl.code_sha256
    key = (of, engine_key, limits.memory_bytes, _RULES, tag)
    cached = cache_dir / f"{of}-{engine_key}-r{_RULES}-{tag}.cwasm" if cache_dir else None
    module, artifact = host.modules.get(key), None
    if module is None:
        module, artifact = _cached(engine, key, cached)
    if module is None:
        remembered = host.failed_before(key)
        if remembered is not None:
            raise LoadError(remembered)
        try:
            (size, runs), values = run_init_sparse(engine, ctrl, host, limits)
        except LoadError as e:
            host.remember_failure(key, str(e))
            raise
        try:
            wasm = snapshot_module(export_mutable_globals(split_arg_prefix(data)[0])[0], size, values,
                                   {abi.EXPORT_INITIALIZE, INIT_EXPORT}, runs=runs)
        except WasmFormatError as e:
            raise LoadError(f"{name}: cannot snapshot its init: {e}") from None
        module, artifact = _compiled(engine, wasm, name, key, None, limits.compile_timeout_s, limits.memory_bytes)
    has_post, has_initialize, wasi = validate(module, name)
    if has_initialize or any(e.name == INIT_EXPORT for e in module.exports):
        raise LoadError(f"{name}: its init snapshot still exports an init function (a foreign cache entry?)")
    if artifact is not None:
        keep_artifact(key, artifact, cached if cached is None or not cached.is_file() else None)
    host.modules[key] = module
    return replace(ctrl, module=module, has_post=has_post, has_initialize=False, wasi_imports=wasi, snapshot=True)


def _cached(engine: wasmtime.Engine, key: tuple,
            cached: Path | None) -> tuple[wasmtime.Module | None, bytes | bytearray | None]:
    """The compiled snapshot from this process's cache (and its serialized form, for a disk
    cache that lacks it) or from the disk cache; (None, None): make it."""
    artifact = _recall(key)
    try:
        if artifact is not None:
            return wasmtime.Module.deserialize(engine, artifact), artifact
        if cached is not None and cached.is_file():
            return wasmtime.Module.deserialize_file(engine, str(cached)), None
    except Exception:  # stale or corrupt cache entry: snapshot again and overwrite
        pass
    return None, None
