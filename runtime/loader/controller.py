"""Loading a controller: read, check against the contract and the limits, rewrite for fork,
compile in a child process under the time limit, cache what was accepted. (A Runtime then
starts controllers with an init export from a snapshot: :mod:`aicirt.loader.snapshot`.)"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import struct
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import wasmtime

from .. import abi
from .admission import structural_problems, wasi_problem
from ..errors import LoadError
from .js_bind import split_arg_prefix
from ..limits import Limits
from ..native.engine_config import MemoryLayout, engine_layout, make_engine
from ..paths import user_cache_dir
from .wasm_binary import WasmFormatError, export_mutable_globals, module_facts

_DEFAULT_MEMORY = Limits().memory_bytes
#: The optional per-tokenizer init export, core type () -> (): run once per (controller,
#: tokenizer) at load, after `_initialize`; requests start from a snapshot of its result
#: (docs/snapshots.md). Not part of WIT world `controller`, like `_initialize`.
INIT_EXPORT = "aicirt_init"


@dataclass(eq=False)
class Controller:
    """A validated, compiled controller module; load once, use for any number of requests."""

    sha256: str
    module: wasmtime.Module
    size: int
    globals: dict[int, str]          # mutable global index -> export name (copied on fork)
    has_post: bool
    has_initialize: bool
    wasi_imports: list[tuple[str, wasmtime.FuncType]] = field(default_factory=list)
    name: str = ""
    has_init: bool = False           # exports INIT_EXPORT
    snapshot: bool = False           # `module` starts where `_initialize` and the init export left off
    arg_prefix: bytes = b""          # prepended to every request's argument (aicirt.loader.js_bind)
    code_sha256: str = ""            # sha256 of the module compiled: `sha256` less the arg-prefix section
    has_prepare: bool = False        # exports abi.EXPORT_PREPARE: per-argument work, cached (core/prepared.py)
    has_prepare_template: bool = False   # and abi.EXPORT_PREPARE_TEMPLATE: run only for a template

    def forget_engine(self) -> None:
        """Its Runtime closed (Runtime calls this): drop the compiled code, which would keep that runtime's wasmtime
        Engine (and its address-space reservation) alive."""
        self.module = None  # type: ignore[assignment]


Signature = tuple[list[str], list[str]]      # (params, results) as wasmtime spells the value types


def _sig(ft: wasmtime.FuncType) -> Signature:
    return [str(p) for p in ft.params], [str(r) for r in ft.results]


def _fmt(sig: Signature) -> str:
    return f"({', '.join(sig[0])}) -> ({', '.join(sig[1])})"


#: A controller module: a path to a .wasm file, or its bytes.
Source = Union[str, "os.PathLike[str]", bytes, bytearray]


def read_source(src: Source, max_bytes: int) -> tuple[bytes, str]:
    """The module's bytes and a display name; raises LoadError for a missing or oversized file
    and for anything that is neither a path nor bytes."""
    if isinstance(src, (bytes, bytearray)):
        data, name = bytes(src), "<bytes>"
    elif isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if not path.is_file():
            raise LoadError(f"{path}: no such file")
        if path.stat().st_size > max_bytes:
            raise LoadError(f"{path}: {path.stat().st_size} bytes is over the upload limit of {max_bytes}")
        data, name = path.read_bytes(), path.name
    else:
        hint = " (pass bytes(...))" if isinstance(src, memoryview) else ""
        raise LoadError(f"a controller is a path or the module's bytes, not {type(src).__name__}{hint}")
    if len(data) > max_bytes:
        raise LoadError(f"{name}: {len(data)} bytes is over the upload limit of {max_bytes}")
    return data, name


def validate(module: wasmtime.Module, name: str) -> tuple[bool, bool, list]:
    """Check exports and imports against docs/protocol.md#wit (and the init export's type). Returns
    (has_post, has_initialize, wasi imports)."""
    exports = {e.name: e.type for e in module.exports}
    problems = []
    init = exports.get(INIT_EXPORT)
    if init is not None and (not isinstance(init, wasmtime.FuncType) or _sig(init) != ([], [])):
        got = _fmt(_sig(init)) if isinstance(init, wasmtime.FuncType) else "not a function"
        problems.append(f"export `{INIT_EXPORT}` (the per-tokenizer init) has type {got}, expected () -> ()")
    if not isinstance(exports.get("memory"), wasmtime.MemoryType):
        problems.append("missing export `memory` (a linear memory)")
    for fname, want in {**abi.REQUIRED_FUNCS, **abi.OPTIONAL_FUNCS}.items():
        ty = exports.get(fname)
        if ty is None:
            if fname in abi.REQUIRED_FUNCS:
                problems.append(f"missing export `{fname}` {_fmt(want)}")
        elif not isinstance(ty, wasmtime.FuncType):
            problems.append(f"export `{fname}` must be a function {_fmt(want)}")
        elif _sig(ty) != want:
            problems.append(f"export `{fname}` has type {_fmt(_sig(ty))}, expected {_fmt(want)}")
    wasi = []
    for imp in module.imports:
        where = f"import `{imp.module}`.`{imp.name}`"
        if imp.module == abi.HOST_MODULE:
            host_want = abi.HOST_IMPORTS.get(imp.name or "")
            if host_want is None:
                problems.append(f"{where} is not in WIT interface `host`")
            elif not isinstance(imp.type, wasmtime.FuncType) or _sig(imp.type) != host_want:
                got = _fmt(_sig(imp.type)) if isinstance(imp.type, wasmtime.FuncType) else "not a function"
                problems.append(f"{where} has type {got}, expected {_fmt(host_want)}")
        elif imp.module == abi.WASI_MODULE and isinstance(imp.type, wasmtime.FuncType):
            problem = wasi_problem(imp.name or "", _sig(imp.type))  # core imports always have a name
            if problem:
                problems.append(problem)
            wasi.append((imp.name, imp.type))
        else:
            problems.append(f"{where} is not provided (only `{abi.HOST_MODULE}` and `{abi.WASI_MODULE}` functions are)")
    if problems:
        raise LoadError(f"{name} is not a controller: " + "; ".join(problems))
    return abi.EXPORT_POST in exports, abi.EXPORT_INITIALIZE in exports, wasi


# The settings compiled code depends on (the epoch, the engine's MemoryLayout) must match the
# Runtime's engine (native/engine_config.py) for the child's artifact to deserialize there.
# Stack size and slot counts do not matter.
# Bumped whenever the loader refuses more: artifacts cached under older rules are not trusted.
_RULES = 2
_WORKER = Path(__file__).resolve().parent / "compile_worker.py"
_ARTIFACT_CACHE_BYTES = 256 << 20
_artifacts: OrderedDict[tuple, bytes | bytearray] = OrderedDict()   # accepted modules only, most recent last
_artifacts_lock = threading.Lock()


def _remember(key: tuple, artifact: bytes | bytearray) -> None:
    with _artifacts_lock:
        _artifacts[key] = artifact
        _artifacts.move_to_end(key)
        while sum(map(len, _artifacts.values())) > _ARTIFACT_CACHE_BYTES and len(_artifacts) > 1:
            _artifacts.popitem(last=False)


def _recall(key: tuple) -> bytes | bytearray | None:
    with _artifacts_lock:
        artifact = _artifacts.get(key)
        if artifact is not None:
            _artifacts.move_to_end(key)
        return artifact


def _compile_in_child(wasm: bytes, timeout_s: float, name: str, layout: MemoryLayout) -> bytes:
    """Scan for fork-unsafe instructions and compile in a child process for slots of `layout`,
    killed at `timeout_s` (with everything it allocated). Returns the serialized module; raises
    LoadError."""
    header = json.dumps({"epoch_interruption": True, "memory_reservation": layout.reservation,
                         "memory_guard_size": layout.guard}).encode()
    proc = subprocess.Popen([sys.executable, "-I", str(_WORKER)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(struct.pack("<I", len(header)) + header + wasm, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise LoadError(f"{name}: compiling took longer than {timeout_s:g} s (stopped)") from None
    if out[:1] == b"K":
        return out[1:]
    if out[:1] == b"E":
        raise LoadError(f"{name}: {out[1:].decode('utf-8', 'replace')}")
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    raise LoadError(f"{name}: the compiler process failed (exit status {proc.returncode}) {tail[0]}".rstrip())


def _compile_in_thread(engine: wasmtime.Engine, wasm: bytes, timeout_s: float, name: str) -> wasmtime.Module:
    """For an engine whose settings the child cannot reproduce: the time limit refuses the
    module, but the compile itself runs on until it ends."""
    box: dict = {}

    def work() -> None:
        try:
            box["module"] = wasmtime.Module(engine, wasm)
        except Exception as e:  # reported below with the module's name
            box["error"] = e

    t = threading.Thread(target=work, daemon=True, name="aicirt-compile")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise LoadError(f"{name}: compiling took longer than {timeout_s:g} s")
    if "error" in box:
        raise LoadError(f"{name}: not a valid Wasm module: {str(box['error']).strip()}")
    return box["module"]


def _compiled(engine: wasmtime.Engine, wasm: bytes, name: str, key: tuple, cached: Path | None, timeout_s: float,
              memory_bytes: int | None) -> tuple[wasmtime.Module, bytes | bytearray | None]:
    """The module from the process cache, the disk cache or a fresh compile, and its serialized
    form unless it came from disk (to be cached once it passes validation)."""
    artifact = _recall(key)
    if artifact is None and cached is not None and cached.is_file():
        try:
            return wasmtime.Module.deserialize_file(engine, str(cached)), None
        except Exception:  # stale or corrupt cache entry: recompile and overwrite
            pass
    layout = engine_layout(engine)   # None: an engine not made by make_engine (its settings guessed)
    if artifact is None:
        artifact = _compile_in_child(wasm, timeout_s, name, layout or MemoryLayout.bounded(memory_bytes or _DEFAULT_MEMORY))
    try:
        return wasmtime.Module.deserialize(engine, artifact), artifact
    except Exception:  # the engine's settings differ from what the child assumed
        if layout is not None:
            raise
        module = _compile_in_thread(engine, wasm, timeout_s, name)
        return module, module.serialize()


def load_controller(engine: wasmtime.Engine, engine_key: str, src: Source, *, max_bytes: int,
                    compile_timeout_s: float, cache_dir: Path | None,
                    memory_bytes: int | None = None, name: str | None = None) -> Controller:
    """Read, check, rewrite and compile a controller (compiled code cached on disk and in this
    process, accepted modules only).

    `memory_bytes`: the engine's memory limit (Limits.memory_bytes), which both the checks and
    the compiled code depend on; None means the default limit, and a compile that then does not
    fit the engine falls back to compiling in this process. Raises LoadError naming what is wrong.
    """
    data, name = read_source(src, max_bytes)
    module_sha = hashlib.sha256(data).hexdigest()
    try:
        # a bound script (js_bind) is no part of the code: the module compiles as the js controller
        code, arg_prefix = split_arg_prefix(data)
        sha = hashlib.sha256(code).hexdigest() if arg_prefix else module_sha
        wasm, globals_ = export_mutable_globals(code)
        problems = structural_problems(module_facts(wasm), memory_bytes or _DEFAULT_MEMORY)
    except WasmFormatError as e:
        raise LoadError(f"{name}: {e}") from None
    if problems:
        raise LoadError(f"{name} cannot run as a controller: " + "; ".join(problems))
    key = (sha, engine_key, memory_bytes, _RULES)
    cached = cache_dir / f"{sha}-{engine_key}-r{_RULES}.cwasm" if cache_dir else None
    module, artifact = _compiled(engine, wasm, name, key, cached, compile_timeout_s, memory_bytes)
    has_post, has_initialize, wasi = validate(module, name)
    if artifact is not None:    # only now, so that nothing refused is ever cached
        keep_artifact(key, artifact, cached)
    names = {e.name for e in module.exports}
    return Controller(module_sha, module, len(data), globals_, has_post, has_initialize, wasi, name,
                      INIT_EXPORT in names, arg_prefix=arg_prefix, code_sha256=sha,
                      has_prepare=abi.EXPORT_PREPARE in names,
                      has_prepare_template=abi.EXPORT_PREPARE in names and abi.EXPORT_PREPARE_TEMPLATE in names)


def keep_artifact(key: tuple, artifact: bytes | bytearray, cached: Path | None) -> None:
    """Keep an accepted module's serialized form in this process and, if `cached`, on disk
    (written atomically; a read-only cache only costs a recompile next time)."""
    _remember(key, artifact)
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(artifact)
            os.replace(tmp, cached)
        except OSError:
            pass


def engine_key(limits: Limits, engine: wasmtime.Engine) -> str:
    """What a Runtime's compiled code depends on (its compile cache key): the wasmtime version,
    the stack, the memory limit and where `engine` (make_engine's) puts each slot's memory."""
    layout = engine_layout(engine) or MemoryLayout.bounded(limits.memory_bytes)
    return hashlib.sha256(f"wasmtime-{importlib.metadata.version('wasmtime')}-stack{limits.stack_bytes}"
                          f"-epoch-pool{limits.memory_bytes}-{layout.key}".encode()).hexdigest()[:12]


def check_controller(src: Source, max_bytes: int = 64 << 20, compile_timeout_s: float = 30.0,
                     limits: Limits | None = None) -> Controller:
    """Validate `src` (path or bytes) without a Runtime: the same checks `Runtime.load` runs,
    against an engine configured as a Runtime's with `limits` (default: Limits()), through the
    Runtimes' disk cache of compiled code (what one of them compiled, or the js controller's code
    under a bound script, compiles nothing; what this compiles and accepts, a Runtime finds). For
    tools that want a quick verdict (`aicirt check`, `aicirt build`, and `aicirt run` before it
    spends seconds loading a model). Raises LoadError."""
    limits = limits or Limits()
    engine = make_engine(limits.stack_bytes, limits.memory_bytes, 1)
    return load_controller(engine, engine_key(limits, engine), src,
                           max_bytes=max_bytes, compile_timeout_s=compile_timeout_s,
                           cache_dir=user_cache_dir("modules"), memory_bytes=limits.memory_bytes)
