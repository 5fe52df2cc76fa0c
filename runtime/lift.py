"""Reading a `mid-process` result out of linear memory and checking it against SPEC §3.

The C hot path lifts the common result (one branch, a mask, no splices) itself; everything else
comes here as a numpy view of linear memory. Every pointer and length is bounds-checked and every
rule of the contract is checked; a violation raises :class:`InvalidResult` with a message that
says what the controller did wrong (the batch turns it into an error for that sequence only).
"""
from __future__ import annotations

import math

import numpy as np

from . import abi
from .capabilities import Capabilities
from .results import Splice


class InvalidResult(Exception):
    """The controller's result breaks the contract; the message says how."""


LiftedBranch = tuple["np.ndarray | None", "float | None", "tuple[Splice, ...]"]   # mask copy, temperature, splices


def check_temperature(value: float, k: int) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise InvalidResult(f"branch {k}: temperature {value} is not a finite number >= 0")
    return value


def read_branches(mem: np.ndarray, ptr: int, n: int, *, vocab_size: int, capabilities: Capabilities,
                  n_seen: int, forks_left: int, max_forks: int) -> list[LiftedBranch]:
    """The `n` branches at `ptr` (the C side checked that the 28-byte records lie in memory).

    `n_seen`: tokens the controller has seen (a splice may backtrack that many, plus the sampled
    token); `forks_left`: forks the request may still make.
    """
    if n > 1:
        if not capabilities & Capabilities.FORK:
            raise InvalidResult(f"returned {n} branches (a fork) but capability `fork` was not granted")
        if n - 1 > forks_left:
            raise InvalidResult(f"fork into {n} branches exceeds the limit of {max_forks} forks per request")
    out = []
    for k in range(n):
        rec = mem[ptr + k * abi.BRANCH_SIZE:ptr + (k + 1) * abi.BRANCH_SIZE]
        f = rec.view(np.uint32)
        has_mask = rec[0] != 0
        mask = read_mask(mem, int(f[1]), int(f[2]), vocab_size, k) if has_mask else None
        temperature = check_temperature(float(rec[16:20].view(np.float32)[0]), k) if rec[12] else None
        splices = read_splices(mem, int(f[5]), int(f[6]), k, vocab_size, capabilities,
                               backtrack_limit=n_seen + (1 if has_mask else 0))
        if not has_mask and (len(splices) != 1 or splices[0].when_sampled):
            raise InvalidResult(f"branch {k} has no mask, so it needs exactly one unconditional splice, got {len(splices)}")
        out.append((mask, temperature, splices))
    return out


def read_mask(mem: np.ndarray, ptr: int, words: int, vocab_size: int, k: int) -> np.ndarray:
    """A copy of the token-set at `ptr`; it must have ceil(V/32) words, no bit >= V, some bit set."""
    want = (vocab_size + 31) // 32
    if words != want:
        raise InvalidResult(f"branch {k}: mask has {words} words, expected ceil({vocab_size}/32) = {want}")
    if ptr + words * 4 > len(mem):
        raise InvalidResult(f"branch {k}: mask [{ptr}, {ptr + words * 4}) is outside linear memory ({len(mem)} bytes)")
    mask = mem[ptr:ptr + words * 4].view(np.uint32)
    tail = vocab_size % 32
    extra = int(mask[-1]) >> tail if tail else 0
    if extra:
        first = (words - 1) * 32 + tail + (extra & -extra).bit_length() - 1
        raise InvalidResult(f"branch {k}: mask allows token {first} >= vocab size {vocab_size}")
    if not mask.any():
        raise InvalidResult(f"branch {k}: mask allows no token")
    return mask.copy()


def read_tokens(mem: np.ndarray, ptr: int, n: int, vocab_size: int, what: str) -> tuple[int, ...]:
    if ptr + n * 4 > len(mem):
        raise InvalidResult(f"{what}: list [{ptr}, {ptr + n * 4}) is outside linear memory ({len(mem)} bytes)")
    ids = mem[ptr:ptr + n * 4].view(np.uint32)
    if n and int(ids.max()) >= vocab_size:
        raise InvalidResult(f"{what}: token id {int(ids.max())} >= vocab size {vocab_size}")
    return tuple(int(t) for t in ids)


def read_splices(mem: np.ndarray, ptr: int, n: int, k: int, vocab_size: int, capabilities: Capabilities,
                 backtrack_limit: int) -> tuple[Splice, ...]:
    if ptr + n * abi.SPLICE_SIZE > len(mem):
        raise InvalidResult(f"branch {k}: splice list [{ptr}, {ptr + n * abi.SPLICE_SIZE}) is outside linear memory")
    out = []
    for j in range(n):
        p = ptr + j * abi.SPLICE_SIZE
        f = mem[p:p + abi.SPLICE_SIZE].view(np.uint32)
        where = f"branch {k} splice {j}"
        when = read_tokens(mem, int(f[0]), int(f[1]), vocab_size, where + " when-sampled")
        backtrack = int(f[2])
        ff = read_tokens(mem, int(f[3]), int(f[4]), vocab_size, where + " ff-tokens")
        if when and not capabilities & Capabilities.CONDITIONAL_FF_TOKENS:
            raise InvalidResult(f"{where}: conditional splice but capability `conditional-ff-tokens` was not granted")
        if backtrack and not capabilities & Capabilities.BACKTRACK:
            raise InvalidResult(f"{where}: backtrack {backtrack} but capability `backtrack` was not granted")
        if ff and not capabilities & Capabilities.FF_TOKENS:
            raise InvalidResult(f"{where}: fast-forward tokens but capability `ff-tokens` was not granted")
        if backtrack > backtrack_limit:
            raise InvalidResult(f"{where}: backtrack {backtrack} reaches past the start of the sequence "
                                f"({backtrack_limit} tokens)")
        out.append(Splice(when, backtrack, ff))
    return tuple(out)
