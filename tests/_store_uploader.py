"""A process that uploads variants of a module to a store, printing each module id once committed.

Usage: python _store_uploader.py ROOT WASM FIRST COUNT [TAG_PREFIX]
(tests/test_store.py runs several at once, and kills some with SIGKILL mid-upload).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _store_helpers import variant  # noqa: E402

from aicirt.serve.store import Store  # noqa: E402


def main() -> None:
    root, wasm, first, count = sys.argv[1], Path(sys.argv[2]).read_bytes(), int(sys.argv[3]), int(sys.argv[4])
    prefix = sys.argv[5] if len(sys.argv) > 5 else None
    store = Store(root)
    for k in range(first, first + count):
        tags = [f"{prefix}{k}", f"{prefix}latest"] if prefix else []
        up = store.put(variant(wasm, k), tags=tags, user="uploader")
        print(up.module_id, flush=True)


if __name__ == "__main__":
    main()
