"""WASI `random_get`'s stream, as wasi.c computes it: splitmix64, seeded from the request's
argument (FNV-1a 64), split at a fork. Deterministic, so a replayed request reads the same bytes;
not cryptographic. States are uint64; 0 means "not seeded yet" (a seed is never 0)."""
from __future__ import annotations

_M64 = (1 << 64) - 1


def seed(arg: bytes) -> int:
    """The request's seed: FNV-1a 64 of its argument, xor a constant; never 0."""
    h = 0xCBF29CE484222325
    for b in arg:
        h = ((h ^ b) * 0x100000001B3) & _M64
    h ^= 0x6A09E667F3BCC909
    return h or 1


def next_u64(state: int) -> tuple[int, int]:
    """(the next state, its output): one splitmix64 step."""
    state = (state + 0x9E3779B97F4A7C15) & _M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return state, z ^ (z >> 31)


def random_bytes(state: int, n: int) -> tuple[int, bytes]:
    """(the next state, `n` bytes): each 8 bytes one output, little-endian; a last partial
    output's unused bytes are dropped (as wasi.c's memcpy)."""
    out = bytearray()
    while len(out) < n:
        state, r = next_u64(state)
        out += r.to_bytes(8, "little")
    return state, bytes(out[:n])


def split(state: int) -> tuple[int, int]:
    """A fork: (the parent's next state, the child's seed, its next output; never 0)."""
    state, r = next_u64(state)
    return state, r or 1
