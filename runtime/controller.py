"""Loading a controller: read, validate against the contract, rewrite for fork, compile, cache."""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import wasmtime

from . import abi
from .errors import LoadError
from .wasm_binary import WasmFormatError, export_mutable_globals


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

    def _release(self) -> None:
        """Its Runtime closed: drop the compiled code, which would keep that runtime's wasmtime
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
    """The module's bytes and a display name; raises LoadError for a missing or oversized file."""
    if isinstance(src, (bytes, bytearray)):
        data, name = bytes(src), "<bytes>"
    else:
        path = Path(src)
        if not path.is_file():
            raise LoadError(f"{path}: no such file")
        if path.stat().st_size > max_bytes:
            raise LoadError(f"{path}: {path.stat().st_size} bytes is over the upload limit of {max_bytes}")
        data, name = path.read_bytes(), path.name
    if len(data) > max_bytes:
        raise LoadError(f"{name}: {len(data)} bytes is over the upload limit of {max_bytes}")
    return data, name


def validate(module: wasmtime.Module, name: str) -> tuple[bool, bool, list]:
    """Check exports and imports against SPEC §2. Returns (has_post, has_initialize, wasi imports)."""
    exports = {e.name: e.type for e in module.exports}
    problems = []
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
            wasi.append((imp.name, imp.type))
        else:
            problems.append(f"{where} is not provided (only `{abi.HOST_MODULE}` and `{abi.WASI_MODULE}` functions are)")
    if problems:
        raise LoadError(f"{name} is not a controller: " + "; ".join(problems))
    return abi.EXPORT_POST in exports, abi.EXPORT_INITIALIZE in exports, wasi


def _compile(engine: wasmtime.Engine, wasm: bytes, timeout_s: float, name: str) -> wasmtime.Module:
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


def load_controller(engine: wasmtime.Engine, engine_key: str, src: Source, *, max_bytes: int,
                    compile_timeout_s: float, cache_dir: Path | None) -> Controller:
    """Read, validate, rewrite and compile a controller (compiled code cached on disk).

    Raises LoadError with a message naming what is wrong.
    """
    data, name = read_source(src, max_bytes)
    sha = hashlib.sha256(data).hexdigest()
    try:
        wasm, globals_ = export_mutable_globals(data)
    except WasmFormatError as e:
        raise LoadError(f"{name}: {e}") from None
    module = None
    cached = cache_dir / f"{sha}-{engine_key}.cwasm" if cache_dir else None
    if cached is not None and cached.is_file():
        try:
            module = wasmtime.Module.deserialize_file(engine, str(cached))
        except Exception:  # stale or corrupt cache entry: recompile and overwrite
            module = None
    if module is None:
        module = _compile(engine, wasm, compile_timeout_s, name)
        if cached is not None:
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                tmp = cached.with_suffix(f".tmp{os.getpid()}")
                tmp.write_bytes(module.serialize())
                os.replace(tmp, cached)
            except OSError:
                pass  # a read-only cache only costs a recompile next time
    has_post, has_init, wasi = validate(module, name)
    return Controller(sha, module, len(data), globals_, has_post, has_init, wasi, name)


def check_controller(src: Source, max_bytes: int = 64 << 20, compile_timeout_s: float = 30.0) -> Controller:
    """Validate `src` (path or bytes) against the contract without a Runtime: a throwaway engine,
    no disk cache. For tools that want a quick verdict (`aicirt check`, `aicirt build`, and
    `aicirt run` before it spends seconds loading a model). Raises LoadError."""
    return load_controller(wasmtime.Engine(), "check", src, max_bytes=max_bytes,
                           compile_timeout_s=compile_timeout_s, cache_dir=None)
