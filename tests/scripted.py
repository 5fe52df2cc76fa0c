"""Encode scripts for tests/controllers/scripted.c: per call, what the controller returns or does.

A script is a list of steps (call k runs step k; the last repeats). A step is built from the
helpers below, e.g. ``result(branch(mask=[65, 66]))`` or ``log("hi", trap())``.
"""
from __future__ import annotations

import struct

OP_RESULT, OP_TRAP, OP_LOOP, OP_GROW, OP_RECURSE, OP_BAD_RESULT_PTR, OP_SWITCH = 1, 2, 3, 4, 5, 6, 7
OP_VAR_SET, OP_LOG, OP_WAIT_VAR, OP_HOST_INFO, OP_BAD_HOST_PTR = 8, 9, 10, 11, 12
OP_SPIN, OP_BAD_TOKENIZE_PTR = 13, 14


def _text(s: str | bytes) -> list[int]:
    raw = s.encode() if isinstance(s, str) else s
    padded = raw + b"\0" * (-len(raw) % 4)
    return [len(raw), *struct.unpack(f"<{len(padded) // 4}I", padded)]


def splice(backtrack: int = 0, ff=(), when=()) -> list[int]:
    return [len(when), *when, backtrack, len(ff), *ff]


def branch(mask=None, temperature: float | None = None, splices=(), raw_mask=None) -> list[int]:
    if raw_mask is not None:
        words = [2, len(raw_mask), *raw_mask]
    elif mask is None:
        words = [0]
    else:
        words = [1, len(mask), *mask]
    temp_bits = struct.unpack("<I", struct.pack("<f", temperature or 0.0))[0]
    words += [temperature is not None, temp_bits, len(splices)]
    for s in splices:
        words += s
    return words


def result(*branches: list[int]) -> list[int]:
    return [OP_RESULT, len(branches), *[w for b in branches for w in b]]


def stop() -> list[int]:
    return result()


def noop() -> list[int]:
    return result(branch(splices=[splice()]))


def trap() -> list[int]:
    return [OP_TRAP]


def loop_forever() -> list[int]:
    return [OP_LOOP]


def grow(pages: int, then: list[int]) -> list[int]:
    return [OP_GROW, pages, *then]


def recurse(depth: int, then: list[int]) -> list[int]:
    return [OP_RECURSE, depth, *then]


def spin(iterations: int, then: list[int]) -> list[int]:
    """Busy-loop in Wasm (no host import), then run the rest: a slow but legal call."""
    return [OP_SPIN, iterations, *then]


def bad_result_ptr() -> list[int]:
    return [OP_BAD_RESULT_PTR]


def bad_host_ptr(then: list[int]) -> list[int]:
    return [OP_BAD_HOST_PTR, *then]


def bad_tokenize_ptr(then: list[int]) -> list[int]:
    """Pass `tokenize` (a Python host import) a pointer outside memory."""
    return [OP_BAD_TOKENIZE_PTR, *then]


def by_fork_index(*steps: list[int]) -> list[int]:
    """Run steps[i] in the i-th member of the last fork group (parent = 0)."""
    out = [OP_SWITCH, len(steps)]
    for s in steps:
        out += [len(s), *s]
    return out


def var_set(name: str, value: bytes | str, then: list[int]) -> list[int]:
    return [OP_VAR_SET, *_text(name), *_text(value), *then]


def log(msg: str, then: list[int]) -> list[int]:
    return [OP_LOG, *_text(msg), *then]


def wait_var(name: str, then: list[int]) -> list[int]:
    return [OP_WAIT_VAR, *_text(name), *then]


def host_info(then: list[int]) -> list[int]:
    return [OP_HOST_INFO, *then]


def script(*steps: list[int]) -> bytes:
    words = [len(steps)]
    for s in steps:
        words += [len(s), *s]
    return struct.pack(f"<{len(words)}I", *words)


def parse_trace(raw: bytes) -> list[dict]:
    """Decode variable "trace": one dict per call, in call order."""
    w = struct.unpack(f"<{len(raw) // 4}I", raw)
    out, i = [], 0
    while i < len(w):
        seq, bt, n = w[i], w[i + 1], w[i + 2]
        toks = list(w[i + 3:i + 3 + n])
        i += 3 + n
        some, sampled, ng = w[i], w[i + 1], w[i + 2]
        group = list(w[i + 3:i + 3 + ng])
        i += 3 + ng
        out.append({"seq": seq, "backtrack": bt, "tokens": toks, "sampled": sampled if some else None, "fork_group": group})
    return out
