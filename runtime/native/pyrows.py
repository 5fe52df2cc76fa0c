"""The rows API's per-step calls as a CPython extension (pyrows.c): built once with zig cc where
Python's headers are installed, cached beside the hot path's library, and bound to each pool
(`CPool`). Where the headers are missing or the build fails, `load()` is None and CPool's
pure-Python calls (cffi, ABI mode) do the same work, about 1 µs a step slower. `AICIRT_PYROWS=0`
in the environment turns the extension off (the tests run both ways)."""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

from .build import BuildError, compile_cached
from .ffi_decl import CDEF_ROWS

_HERE = Path(__file__).resolve().parent
log = logging.getLogger("aicirt.native")
_lock = threading.Lock()
_state: dict[str, object] = {}   # "module": the extension or None once tried; "why": why it is None


def load() -> ModuleType | None:
    """The extension (its `submitter` and `finisher`), built on first use; None where it cannot
    be (see `why_not`) or AICIRT_PYROWS=0."""
    if os.environ.get("AICIRT_PYROWS", "1") == "0":
        return None
    with _lock:
        if "module" not in _state:
            _state["module"], _state["why"] = _build()
            if _state["module"] is None:   # once a process: the rows API runs, through cffi
                log.info("the rows API's calls go through cffi, about 1 µs a step slower: %s", _state["why"])
        return _state["module"]   # type: ignore[return-value]


def why_not() -> str | None:
    """Why `load()` is None (None: it is not, or was not tried yet)."""
    if os.environ.get("AICIRT_PYROWS", "1") == "0":
        return "AICIRT_PYROWS=0"
    return _state.get("why")   # type: ignore[return-value]


def _build() -> tuple[ModuleType | None, str | None]:
    include = sysconfig.get_paths().get("include") or ""
    if not (Path(include) / "Python.h").is_file():
        return None, f"no Python.h under {include!r} (install Python's development headers)"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    source = "#include <stdint.h>\n" + CDEF_ROWS + (_HERE / "pyrows.c").read_text()
    try:
        path = compile_cached("aicirt_pyrows", source, flags=(f"-I{include}",), suffix=suffix,
                              key_extra=sys.version)
        spec = importlib.util.spec_from_file_location("aicirt_pyrows", path)
        if spec is None or spec.loader is None:
            return None, f"cannot load {path}"
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (BuildError, ImportError, OSError) as e:
        return None, f"{type(e).__name__}: {e}"
    return module, None
