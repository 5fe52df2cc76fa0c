"""atheris entry point, on demand (atheris is not a dependency):

    pip install atheris
    python tests/fuzz/fuzz_parsers.py module  -max_total_time=300 [corpus/]
    python tests/fuzz/fuzz_parsers.py result  -max_total_time=300
    python tests/fuzz/fuzz_parsers.py trie    -max_total_time=300
    python tests/fuzz/fuzz_parsers.py host    -max_total_time=300   (through a Runtime: slower)

Runs the targets of targets.py (the same ones the Hypothesis tests run), so a crash atheris
finds is a failing input for `targets.<name>(data)`.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import atheris

    with atheris.instrument_imports():
        from fuzz import host_targets, targets
    names = {"module": targets.module_parsers, "result": targets.lifted_result, "trie": targets.trie_round_trip,
             "host": host_targets.host_call}
    if len(sys.argv) < 2 or sys.argv[1] not in names:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(names)}}} [libFuzzer options]")
    target = names[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
