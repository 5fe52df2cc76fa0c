"""Building the hot path: slot.c, clock.c, step.c, pool.c, rows.c, host.c, wasi.c, pages.c and
spawn.c (with the generated ABI header) as one plain shared library, compiled once with the
`ziglang` package the runtime already requires (its `zig cc`), and loaded with cffi's ABI mode
(`ffi.dlopen`): no system C compiler and no Python headers are needed. The library is cached
under the user cache dir, keyed by its source, its declarations and the zig version.
`build_cached` builds any other such library the same way (the vLLM adapter's masking kernel)."""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import cffi

from .. import abi
from ..paths import user_cache_dir
from .ffi_decl import CDEF_SLOT, CDEF_STEP, CDEF_VARS
from .types import CFFI, CLib

_HERE = Path(__file__).resolve().parent
#: the hot path's C files, in build order (one translation unit: later files use earlier ones' statics)
SOURCES = ("slot.c", "clock.c", "step.c", "pool.c", "rows.c", "host.c", "wasi.c", "pages.c", "spawn.c")
# -mcpu=baseline: the cache dir may be shared by machines of one architecture (a -march=native
# build dies with SIGILL elsewhere)
CFLAGS = ("-shared", "-fPIC", "-O3", "-mcpu=baseline", "-fno-sanitize=undefined", "-fno-strict-aliasing")
_lock = threading.Lock()
_loaded: dict[str, "Library"] = {}


@dataclass(frozen=True)
class Library:
    """A built library: `ffi` (its cffi declarations) and `lib` (its functions, ABI mode)."""
    ffi: CFFI
    lib: CLib
    path: Path


class BuildError(RuntimeError):
    """The C could not be compiled (the compiler's message included)."""


def load_extension() -> Library:
    """The hot path's library, built on first use. Raises BuildError if zig cannot build it."""
    source = abi.c_header() + "".join((_HERE / name).read_text() for name in SOURCES)
    return build_cached("libaicirt_step", source, CDEF_SLOT + CDEF_VARS + CDEF_STEP)


def _zig_version() -> str:
    try:
        return importlib.metadata.version("ziglang")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def build_cached(prefix: str, source: str, cdef: str) -> Library:
    """C `source` as a shared library declaring `cdef`, compiled once with zig cc into the user
    cache dir (named `prefix` plus a hash of its text, the zig version and the machine), loaded
    once per process. Raises BuildError where zig fails."""
    with _lock:
        path = compile_cached(prefix, source, key_extra=cdef)
        done = _loaded.get(path.name)
        if done is None:
            ffi = cffi.FFI()
            ffi.cdef(cdef)
            done = _loaded[path.name] = Library(ffi, resolve_all(ffi.dlopen(str(path))), path)
        return done


def compile_cached(prefix: str, source: str, flags: tuple[str, ...] = (), suffix: str = ".so",
                   key_extra: str = "") -> Path:
    """C `source` compiled once with zig cc (CFLAGS + `flags`) into the user cache dir as
    `prefix`_<hash of its text, `key_extra`, the flags, the zig version and the machine>`suffix`;
    returns its path. Raises BuildError where zig fails."""
    key = hashlib.sha256("\0".join((source, key_extra, _zig_version(), platform.machine(), " ".join(CFLAGS + flags))
                                    ).encode()).hexdigest()[:16]
    name = f"{prefix}_{key}"
    out = user_cache_dir("native")
    final = out / f"{name}{suffix}"
    if not final.exists():
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f"build-{os.getpid()}-{threading.get_ident()}"
        tmp.mkdir(exist_ok=True)
        src, so = tmp / f"{name}.c", tmp / f"{name}{suffix}"
        src.write_text(source)
        cmd = [sys.executable, "-m", "ziglang", "cc", *CFLAGS, *flags, "-o", str(so), str(src), "-lpthread", "-lm"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if run.returncode != 0 or not so.exists():
            raise BuildError(f"zig cc failed to build {name} ({run.returncode}): {run.stderr.strip()[-2000:]}")
        os.replace(so, final)   # atomic: a concurrent build of the same key just wins or loses
        for leftover in tmp.iterdir():
            leftover.unlink()
        tmp.rmdir()
    return final


def resolve_all(lib: CLib) -> CLib:
    """`lib` with every declared name looked up now. An ABI-mode lib resolves a name on first use
    under its FFI's lock, which the same FFI also holds while it parses a type: a finalizer that
    GC runs inside such a parse (a pool's or a sequence's release) and touches a name not yet
    used deadlocks the process. Looked up once here, a name is a plain attribute after."""
    for name in dir(lib):
        getattr(lib, name)
    return lib
