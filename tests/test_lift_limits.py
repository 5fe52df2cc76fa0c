"""Lifting a result at Limits.max_splices / max_result_tokens costs the caller what any result
costs: no Python work per token id (counted in Python calls, not in wall time)."""
from __future__ import annotations

import struct
import sys

import numpy as np
import pytest

from aicirt import Capabilities, Limits, abi, native
from aicirt.core.lift import InvalidResult, read_branches

VOCAB = 257
MASK_AT, SPLICES_AT, TOKENS_AT = 64, 1024, 4096


def memory(n_splices: int, tokens_each: int) -> np.ndarray:
    """One branch (a mask allowing token 65, then `n_splices` splices, each conditional on
    `tokens_each` ids and fast-forwarding as many) at address 0."""
    mem = np.zeros(TOKENS_AT + 8 * n_splices * tokens_each + 64, dtype=np.uint8)
    words = (VOCAB + 31) // 32
    mem[:abi.BRANCH_SIZE] = np.frombuffer(struct.pack("<B3xIIB3xfII", 1, MASK_AT, words, 0, 0.0, SPLICES_AT,
                                                      n_splices), dtype=np.uint8)
    mem[MASK_AT + 8] = 2                                         # token 65
    ids = (np.arange(n_splices * tokens_each * 2, dtype=np.uint32) % VOCAB)
    mem[TOKENS_AT:TOKENS_AT + ids.nbytes] = ids.view(np.uint8)
    for j in range(n_splices):
        when = TOKENS_AT + 8 * j * tokens_each
        rec = struct.pack("<5I", when, tokens_each, 1, when + 4 * tokens_each, tokens_each)
        mem[SPLICES_AT + j * abi.SPLICE_SIZE:SPLICES_AT + (j + 1) * abi.SPLICE_SIZE] = np.frombuffer(rec, np.uint8)
    return mem


def lift(mem: np.ndarray, limits: Limits = Limits()):
    return read_branches(mem, 0, 1, vocab_size=VOCAB, capabilities=Capabilities.ALL, n_seen=10, forks_left=0,
                         limits=limits, check_mask=native.get_native().check_mask)


def python_calls(fn) -> int:
    """Python-level calls (generator resumptions included) while `fn` runs."""
    count = [0]

    def prof(frame, event, arg):
        if event == "call":
            count[0] += 1
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]


def test_a_result_at_the_limits_reads_right():
    limits = Limits()
    each = limits.max_result_tokens // (2 * limits.max_splices)         # when + ff: exactly at the limit
    (mask, temp, splices), = lift(memory(limits.max_splices, each))
    assert len(splices) == limits.max_splices and sum(len(s.when_sampled) + len(s.ff_tokens) for s in splices) == \
        limits.max_result_tokens
    assert splices[3].when_sampled[:3] == (6 * each % VOCAB, (6 * each + 1) % VOCAB, (6 * each + 2) % VOCAB)
    assert splices[3].backtrack == 1 and all(type(t) is int for t in splices[3].ff_tokens)
    over = Limits(max_result_tokens=limits.max_result_tokens - 1)
    with pytest.raises(InvalidResult, match="Limits.max_result_tokens"):
        lift(memory(limits.max_splices, each), over)


def test_a_result_at_the_limits_costs_what_a_small_one_does():
    limits = Limits()
    each = limits.max_result_tokens // (2 * limits.max_splices)
    big, small = memory(limits.max_splices, each), memory(1, 1)
    calls_big, calls_small = python_calls(lambda: lift(big)), python_calls(lambda: lift(small))
    # per splice, a bounded number of calls; none per token id (before: 65,536 generator steps)
    assert calls_big <= 4 * limits.max_splices * max(calls_small, 1), (calls_big, calls_small)
