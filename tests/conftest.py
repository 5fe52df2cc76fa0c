"""Shared fixtures: compiled test controllers, runtimes over a byte-level tokenizer, both hot paths."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

import aicirt
from aicirt import native

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

_BUILD_DIR = Path.home() / ".cache" / "aicirt" / "test-controllers"


def compile_freestanding(src: Path) -> Path:
    """Compile a libc-free C test controller once (cached by source hash)."""
    text = src.read_bytes()
    out = _BUILD_DIR / f"{src.stem}-{hashlib.sha256(text).hexdigest()[:12]}.wasm"
    if not out.exists():
        _BUILD_DIR.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        subprocess.run([sys.executable, "-m", "ziglang", "cc", "--target=wasm32-freestanding", "-nostdlib", "-O2",
                        "-Wl,--no-entry", str(src), "-o", str(tmp)], check=True)
        tmp.replace(out)
    return out


@pytest.fixture(scope="session")
def scripted_wasm() -> Path:
    return compile_freestanding(HERE / "controllers" / "scripted.c")


@pytest.fixture(params=["compiled", "python"], scope="session")
def hot_path(request):
    """Run a test over both the C hot path and the pure-Python fallback."""
    old = native._native
    if request.param == "python":
        import os
        os.environ["AICIRT_NATIVE"] = "python"
        native._native = native.Native()
        del os.environ["AICIRT_NATIVE"]
    else:
        native._native = None
        native.get_native()
        assert native._native.mode == "compiled"
    yield request.param
    native._native = old


@pytest.fixture
def rt(hot_path):
    runtime = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False)
    yield runtime
    runtime.close()


@pytest.fixture
def make_rt(hot_path):
    made = []

    def make(**limits):
        runtime = aicirt.Runtime(aicirt.ByteTokenizer(), limits=aicirt.Limits(**limits), cache_dir=False)
        made.append(runtime)
        return runtime
    yield make
    for r in made:
        r.close()


def mask_tokens(outcome, row: int) -> list[int]:
    """The token ids a mask row allows."""
    import numpy as np
    bits = np.unpackbits(outcome.masks[row].view(np.uint8), bitorder="little")
    return [int(t) for t in np.nonzero(bits)[0]]
