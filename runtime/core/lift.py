"""Reading a `mid-process` result out of linear memory and checking it against docs/protocol.md#semantics.

The hot path lifts the common result (one branch, a mask, no splices) itself and reports what
was wrong by status and detail (:func:`status_message` words it); everything else comes here as
a numpy view of linear memory. Every pointer and length is bounds-checked and every rule of the
contract is checked (masks by the hot path's own mask rule, `check_mask`); a violation raises
:class:`InvalidResult` with a message that says what the controller did wrong (the batch turns
it into an error for that sequence only).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .. import abi
from ..abi import Status
from ..capabilities import Capabilities
from ..limits import Limits
from .results import Splice


class InvalidResult(Exception):
    """The controller's result breaks the contract; the message says how."""


LiftedBranch = tuple["np.ndarray | None", "float | None", "tuple[Splice, ...]"]   # mask copy, temperature, splices


def check_temperature(value: float, k: int) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise InvalidResult(f"branch {k}: temperature {value} is not a finite number >= 0")
    return value


def status_message(status: int, d0: int, d1: int, vocab_size: int, k: int = 0) -> str:
    """The message for a failed hot-path status and its detail words (see abi.Status)."""
    if status == Status.BAD_MASK_LEN:
        want = (vocab_size + 31) // 32
        return f"branch {k}: mask has {d0} words, expected ceil({vocab_size}/32) = {want}"
    if status == Status.BAD_MASK_RANGE:
        return f"branch {k}: mask [{d0}, {d0 + d1 * 4}) is outside linear memory"
    if status == Status.BAD_MASK_BITS:
        return f"branch {k}: mask allows token {d0} >= vocab size {vocab_size}"
    if status == Status.EMPTY_MASK:
        return f"branch {k}: mask allows no token"
    if status == Status.BAD_ALLOC:
        return f"cabi_realloc returned [{d0}, {d0 + d1}) for the arguments: misaligned or outside linear memory"
    return f"internal: unknown status {status}"


def read_branches(mem: np.ndarray, ptr: int, n: int, *, vocab_size: int, capabilities: Capabilities,
                  n_seen: int, forks_left: int, limits: Limits,
                  check_mask: Callable[[int, int, int, int, int, int], tuple[int, int, int]]) -> list[LiftedBranch]:
    """The `n` branches at `ptr` (the hot path checked that the records lie in memory).

    `n_seen`: tokens the controller has seen (a splice may backtrack that many, plus the sampled
    token); `forks_left`: forks the request may still make; `check_mask`: the hot path's mask
    rule (Native.check_mask). What is read is bounded by `limits` (forks, splices per branch,
    token ids in all splices) before it is read, so a result costs the host little whatever it says.
    """
    if n > 1:
        if not capabilities & Capabilities.FORK:
            raise InvalidResult(f"returned {n} branches (a fork) but capability `fork` was not granted")
        if n - 1 > forks_left:
            raise InvalidResult(f"fork into {n} branches exceeds the limit of {limits.max_forks} forks per request")
    budget = [limits.max_result_tokens]
    out = []
    for k in range(n):
        rec = mem[ptr + k * abi.BRANCH_SIZE:ptr + (k + 1) * abi.BRANCH_SIZE]
        f = lambda off: int(rec[off:off + 4].view(np.uint32)[0])  # noqa: E731
        has_mask = rec[abi.BRANCH_MASK_TAG] != 0
        mask = None
        if has_mask:
            mask = np.empty((vocab_size + 31) // 32, dtype=np.uint32)
            st, d0, d1 = check_mask(mem.ctypes.data, len(mem), f(abi.BRANCH_MASK_PTR), f(abi.BRANCH_MASK_LEN),
                                    vocab_size, mask.ctypes.data)
            if st != Status.OK:
                raise InvalidResult(status_message(st, d0, d1, vocab_size, k))
        temperature = None
        if rec[abi.BRANCH_TEMP_TAG]:
            value = rec[abi.BRANCH_TEMP_VALUE:abi.BRANCH_TEMP_VALUE + 4].view(np.float32)[0]
            temperature = check_temperature(float(value), k)
        n_splices = f(abi.BRANCH_SPLICES_LEN)
        if n_splices > limits.max_splices:
            raise InvalidResult(f"branch {k}: {n_splices} splices, over the limit of {limits.max_splices} "
                                f"(Limits.max_splices)")
        splices = read_splices(mem, f(abi.BRANCH_SPLICES_PTR), n_splices, k, vocab_size,
                               capabilities, backtrack_limit=n_seen + (1 if has_mask else 0), budget=budget)
        if not has_mask and (len(splices) != 1 or splices[0].when_sampled):
            raise InvalidResult(f"branch {k} has no mask, so it needs exactly one unconditional splice, got {len(splices)}")
        out.append((mask, temperature, splices))
    return out


def read_tokens(mem: np.ndarray, ptr: int, n: int, vocab_size: int, what: str, budget: list[int]) -> tuple[int, ...]:
    """Token ids at `ptr`; `budget[0]`: how many the result may still hold (decremented)."""
    if n > budget[0]:
        raise InvalidResult(f"{what}: the result's splices hold more than the limit of token ids "
                            f"(Limits.max_result_tokens)")
    budget[0] -= n
    if ptr + n * 4 > len(mem):
        raise InvalidResult(f"{what}: list [{ptr}, {ptr + n * 4}) is outside linear memory ({len(mem)} bytes)")
    ids = mem[ptr:ptr + n * 4].view(np.uint32)
    if n and int(ids.max()) >= vocab_size:
        raise InvalidResult(f"{what}: token id {int(ids.max())} >= vocab size {vocab_size}")
    return tuple(ids.tolist())   # in C: no Python step per token id


def read_splices(mem: np.ndarray, ptr: int, n: int, k: int, vocab_size: int, capabilities: Capabilities,
                 backtrack_limit: int, budget: list[int]) -> tuple[Splice, ...]:
    if ptr + n * abi.SPLICE_SIZE > len(mem):
        raise InvalidResult(f"branch {k}: splice list [{ptr}, {ptr + n * abi.SPLICE_SIZE}) is outside linear memory")
    out = []
    # every record in one read (n is at most Limits.max_splices): five uint32 fields a splice
    fields = mem[ptr:ptr + n * abi.SPLICE_SIZE].view(np.uint32).reshape(n, abi.SPLICE_SIZE // 4).tolist()
    w = abi.SPLICE_WHEN_PTR // 4, abi.SPLICE_WHEN_LEN // 4, abi.SPLICE_BACKTRACK // 4, abi.SPLICE_FF_PTR // 4, \
        abi.SPLICE_FF_LEN // 4
    for j, rec in enumerate(fields):
        where = f"branch {k} splice {j}"
        when = read_tokens(mem, rec[w[0]], rec[w[1]], vocab_size, where + " when-sampled", budget)
        backtrack = rec[w[2]]
        ff = read_tokens(mem, rec[w[3]], rec[w[4]], vocab_size, where + " ff-tokens", budget)
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
