"""atheris entry point, on demand (atheris is not a dependency):

    pip install atheris
    python tests/fuzz/fuzz_parsers.py module  -max_total_time=300 [corpus/]
    python tests/fuzz/fuzz_parsers.py result  -max_total_time=300
    python tests/fuzz/fuzz_parsers.py trie    -max_total_time=300
    python tests/fuzz/fuzz_parsers.py host    -max_total_time=300   (through a Runtime: slower)
    python tests/fuzz/fuzz_parsers.py server  -max_total_time=300   (`aicirt serve`'s app in-process)

Runs the targets of targets.py, host_targets.py and server_targets.py (the same ones the Hypothesis
tests run), so a crash atheris finds is a failing input for `targets.<name>(data)`, etc.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


#: name: (module in tests/fuzz/, its target function)
TARGETS = {"module": ("targets", "module_parsers"), "result": ("targets", "lifted_result"),
           "trie": ("targets", "trie_round_trip"), "host": ("host_targets", "host_call"),
           "server": ("server_targets", "raw_request")}


def main() -> None:
    import importlib

    import atheris

    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(TARGETS)}}} [libFuzzer options]")
    module, func = TARGETS[sys.argv.pop(1)]
    # Only the chosen target's imports. atheris 2.3 on Python 3.11 segfaults instrumenting
    # fastapi's and pydantic's, and miscompiles wasm_binary's reader (`r.byte()` on an int) where
    # the uninstrumented code runs fine: the server target instruments the server's code alone.
    include = None
    if module == "server_targets":
        include = ["aicirt", "fuzz"]      # matched on the top-level package: the rest is imported first
        for name in ("fastapi.testclient", "pydantic", "aicirt", "aicirt.engine.backends", "aicirt.build.toolchain",
                     "hostile.wat"):
            importlib.import_module(name)
    with atheris.instrument_imports(include=include):
        target = getattr(importlib.import_module(f"fuzz.{module}"), func)
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
