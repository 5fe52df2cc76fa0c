"""Building the compiled hot path: step.c + host.c + wasi.c + pages.c + spawn.c (with the generated ABI header), once, with
cffi's API mode; the extension is cached under the user cache dir, keyed by its sources. `build_cached`
builds any other such extension the same way (the vLLM adapter's masking kernel)."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

import cffi

from .. import abi
from ..paths import user_cache_dir
from .ffi_decl import CDEF_SLOT, CDEF_STEP, CDEF_VARS

_HERE = Path(__file__).resolve().parent
_lock = threading.Lock()


def load_extension() -> ModuleType:
    """The compiled module (``.ffi``, ``.lib``), built on first use. Raises if no C compiler works."""
    source = (abi.c_header() + (_HERE / "step.c").read_text() + (_HERE / "host.c").read_text()
              + (_HERE / "wasi.c").read_text() + (_HERE / "pages.c").read_text() + (_HERE / "spawn.c").read_text())
    return build_cached("_aicirt_step", source, CDEF_SLOT + CDEF_VARS + CDEF_STEP)


def build_cached(prefix: str, source: str, cdef: str) -> ModuleType:
    """The cffi API-mode extension of C `source` declaring `cdef` (``.ffi``, ``.lib``): compiled
    once with -O3 into the user cache dir, named `prefix` plus a hash of its text, and imported
    once per process. Raises (cffi's VerificationError, a CompileError) if no C compiler works."""
    key = hashlib.sha256((source + cdef + sys.version + cffi.__version__).encode()).hexdigest()[:16]
    name = f"{prefix}_{key}"
    out = user_cache_dir("native")
    with _lock:
        built = list(out.glob(name + "*.so")) if out.exists() else []
        if not built:
            out.mkdir(parents=True, exist_ok=True)
            builder = cffi.FFI()
            builder.cdef(cdef)
            builder.set_source(name, source, extra_compile_args=["-O3"])
            tmp = out / f"build-{os.getpid()}-{threading.get_ident()}"
            so = builder.compile(tmpdir=str(tmp), verbose=False)
            final = out / Path(so).name
            os.replace(so, final)   # atomic: a concurrent build of the same key just wins or loses
            built = [final]
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, built[0])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[name] = mod
    return mod
