"""One-input fuzz targets over everything that parses untrusted bytes. Each takes raw bytes,
must never raise anything but the documented error, and checks a property where one exists.
Used by tests/test_parsers_fuzz.py (Hypothesis) and tests/fuzz/fuzz_parsers.py (atheris).
"""
from __future__ import annotations

import struct

import numpy as np
import wasmtime

from aicirt import Capabilities, Limits
from aicirt.native import get_native
from aicirt.loader.admission import structural_problems
from aicirt.core.lift import InvalidResult, read_branches
from aicirt.host.toktrie import iter_tokens, serialize_trie
from aicirt.loader.wasm_binary import WasmFormatError, export_mutable_globals, module_facts
from aicirt.loader.wasm_code import fork_unsafe_instruction

_validator = wasmtime.Engine()
_LIMITS = Limits()


def module_parsers(wasm: bytes) -> None:
    """The loader's own parsers (rewrite for fork, facts, fork-safety scan) raise only
    WasmFormatError, and on a module wasmtime accepts they do not fail at all: the rewrite
    stays a valid module and the instruction decoder reads every body."""
    try:
        rewritten, _ = export_mutable_globals(wasm)
        facts = module_facts(rewritten)
        structural_problems(facts, 64 << 20)
        fork_unsafe_instruction(rewritten, facts)
        parsed = True
    except WasmFormatError:
        parsed = False
    try:
        wasmtime.Module.validate(_validator, wasm)
    except Exception:
        return
    assert parsed, "wasmtime accepts this module but the loader's parser does not"
    wasmtime.Module.validate(_validator, rewritten)


def lifted_result(data: bytes, vocab_size: int = 257) -> None:
    """A result read from arbitrary linear memory: a checked list of branches or InvalidResult."""
    if len(data) < 8:
        return
    ptr, n = struct.unpack_from("<II", data)
    mem = np.frombuffer(data[8:] + b"\0" * 64, dtype=np.uint8)
    ptr %= len(mem)
    n %= 8
    if ptr + 28 * n > len(mem):        # the C side checks this before Python lifts
        return
    try:
        branches = read_branches(mem, ptr, n, vocab_size=vocab_size, capabilities=Capabilities.ALL, n_seen=4,
                                 forks_left=16, limits=_LIMITS, check_mask=get_native().check_mask)
    except InvalidResult:
        return
    words = (vocab_size + 31) // 32
    for mask, temperature, splices in branches:
        assert mask is None or (mask.shape == (words,) and mask.any())
        assert temperature is None or temperature >= 0
        for s in splices:
            assert all(0 <= t < vocab_size for t in (*s.when_sampled, *s.ff_tokens)) and s.backtrack <= 5


def trie_round_trip(data: bytes) -> None:
    """Any vocabulary (tokens split from `data` at 0xFF) serializes to a trie that reads back
    as exactly its non-empty tokens."""
    tokens = data.split(b"\xff")[:512]
    blob = serialize_trie(tokens)
    got = sorted(iter_tokens(blob))
    assert got == sorted((i, t) for i, t in enumerate(tokens) if t)
