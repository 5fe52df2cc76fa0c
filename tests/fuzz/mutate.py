"""Byte-level mutation of a well-formed input, for the Hypothesis tests: one to four bit flips,
deletions, insertions (from `inserts`) and overwrites (from `overwrites`), at `start` or after."""
from __future__ import annotations

from hypothesis import strategies as st


def mutate(draw, base: bytes, *, inserts, overwrites, start: int = 0) -> bytes:
    raw = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        if len(raw) <= start:
            break
        i = draw(st.integers(start, len(raw) - 1))
        op = draw(st.sampled_from(["flip", "drop", "insert", "byte"]))
        if op == "flip":
            raw[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "drop":
            del raw[i]
        elif op == "insert":
            raw[i:i] = draw(inserts)
        else:
            raw[i] = draw(overwrites)
    return bytes(raw)
