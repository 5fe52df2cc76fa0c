"""The one hot path: the C in runtime/native/ built with the `ziglang` package's zig cc as a plain
shared library and loaded with cffi's ABI mode (no system C compiler, no Python headers)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

from aicirt import native
from aicirt.native import build


def test_the_hot_path_is_a_plain_library_loaded_in_abi_mode():
    lib = native.get_native().impl.library
    assert lib.path.suffix == ".so" and lib.path.exists() and lib.path.parent.name == "native"
    assert type(lib.lib).__name__.startswith("FFILibrary")   # ffi.dlopen's lib, not an API-mode extension module
    assert not any(name.startswith("_aicirt_step") for name in sys.modules)
    # one translation unit of one file per idea, in build order
    assert build.SOURCES[:5] == ("slot.c", "clock.c", "step.c", "pool.c", "rows.c")


def test_every_declared_name_is_resolved_at_load():
    """An ABI-mode lib resolves a name on first use under its FFI's lock, which that FFI also holds
    while it parses a type: a pool's finalizer run by GC inside such a parse hung the process
    (bench/step_overhead.py --fork-only). Every name is looked up at load instead."""
    nat = native.get_native()
    for lib in (nat.impl.lib, nat.wtlib):
        names = dir(lib)
        assert names and all(name in vars(lib) for name in names)


def test_a_library_builds_with_zig_and_no_system_compiler(tmp_path):
    """build_cached with no C compiler on PATH (zig runs as `python -m ziglang`) and no CC."""
    tag = uuid.uuid4().hex[:8]
    code = textwrap.dedent(f"""
        from aicirt.native.build import build_cached
        lib = build_cached("test_add_{tag}", "int aicirt_test_add(int a, int b) {{ return a + b + {len(tag)}; }}",
                           "int aicirt_test_add(int a, int b);")
        print(lib.lib.aicirt_test_add(2, 3))
        lib.path.unlink()
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CFLAGS", "PATH")}
    env["PATH"] = str(tmp_path)   # an empty folder: no cc, gcc or clang to find
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(5 + len(tag))
