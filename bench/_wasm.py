"""Build the benchmarks' own libc-free controllers (cached by source hash)."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path


def build_freestanding(src: Path) -> Path:
    out = Path.home() / ".cache" / "aicirt" / "bench" / f"{src.stem}-{hashlib.sha256(src.read_bytes()).hexdigest()[:12]}.wasm"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "ziglang", "cc", "--target=wasm32-freestanding", "-nostdlib", "-O2",
                        "-Wl,--no-entry", str(src), "-o", str(out)], check=True)
    return out
