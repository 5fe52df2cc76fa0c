"""Helpers for store and server tests: distinct valid modules from one controller."""
from __future__ import annotations


def _leb(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def variant(wasm: bytes, k: int) -> bytes:
    """`wasm` plus a custom section holding `k`: the same controller under another module id."""
    name = b"aicirt-test"
    payload = _leb(len(name)) + name + str(k).encode()
    return wasm + b"\x00" + _leb(len(payload)) + payload
