"""The canonical-ABI lowering of world `controller` (docs/protocol.md#wit), written once.

Names, core signatures, record layouts and the hot path's status codes live here and nowhere
else: the C hot path receives them as generated ``#define``s (:func:`c_header`), the Python
lifter read them from this module, and ``tests/test_abi.py`` derives the layouts
from ``wit/aici.wit`` with the canonical ABI's size/alignment rules and checks them against these.
"""
from __future__ import annotations

from enum import IntEnum

HOST_MODULE = "aici:controller/host@0.1.0"
WASI_MODULE = "wasi_snapshot_preview1"

I32 = "i32"
# Core signatures (params, results) of the exports a controller must / may have.
EXPORT_MID_PROCESS = "mid-process"
EXPORT_REALLOC = "cabi_realloc"
EXPORT_POST = "cabi_post_mid-process"
EXPORT_INITIALIZE = "_initialize"
#: The optional per-argument prepare (docs/protocol.md#binary): () -> (), run once per (controller,
#: argument) before the first mid-process; the runtime may start later requests from its state.
EXPORT_PREPARE = "aicirt_prepare"
#: Its optional second half: () -> (), run after it only on the request whose state becomes the
#: template (work that pays only when later requests start from a copy: caches built ahead).
EXPORT_PREPARE_TEMPLATE = "aicirt_prepare_template"
REQUIRED_FUNCS: dict[str, tuple[list[str], list[str]]] = {
    EXPORT_MID_PROCESS: ([I32] * 7, [I32]),
    EXPORT_REALLOC: ([I32] * 4, [I32]),
}
OPTIONAL_FUNCS: dict[str, tuple[list[str], list[str]]] = {
    EXPORT_POST: ([I32], []),
    EXPORT_INITIALIZE: ([], []),
    EXPORT_PREPARE: ([], []),
    EXPORT_PREPARE_TEMPLATE: ([], []),
}

# Host imports, lowered: lists/strings are (ptr, len); results that do not fit one core value
# go through a trailing return-area pointer. The order is the import index the hot path uses.
HOST_IMPORTS = {
    "vocab-size": ([], [I32]),
    "eos-token": ([], [I32]),
    "token-trie": ([I32], []),
    "tokenize": ([I32, I32, I32], []),
    "detokenize": ([I32, I32, I32], []),
    "arg": ([I32], []),
    "self-seq-id": ([], [I32]),
    "capabilities": ([], [I32]),
    "var-get": ([I32, I32, I32], []),
    "var-set": ([I32, I32, I32, I32], []),
    "var-append": ([I32, I32, I32, I32], []),
    "log": ([I32, I32], []),
}
# The imports a controller may call on every step: native callbacks on the worker thread, no GIL.
NATIVE_IMPORTS = ("vocab-size", "eos-token", "arg", "self-seq-id", "capabilities",
                  "var-get", "var-set", "var-append", "log")

# Record layouts (bytes), canonical ABI: the result record is {ptr: u32, len: u32} of the branch list.
RESULT_SIZE = 8
BRANCH_SIZE = 28
BRANCH_MASK_TAG = 0        # option<token-set>: tag u8 @0, list ptr @4, len @8
BRANCH_MASK_PTR = 4
BRANCH_MASK_LEN = 8
BRANCH_TEMP_TAG = 12       # option<f32>: tag u8 @12, value @16
BRANCH_TEMP_VALUE = 16
BRANCH_SPLICES_PTR = 20    # list<splice>
BRANCH_SPLICES_LEN = 24
SPLICE_SIZE = 20
SPLICE_WHEN_PTR = 0        # when-sampled: list<token-id>
SPLICE_WHEN_LEN = 4
SPLICE_BACKTRACK = 8
SPLICE_FF_PTR = 12         # ff-tokens: list<token-id>
SPLICE_FF_LEN = 16

# `option<list<u8>>` return area of var-get: tag @0, ptr @4, len @8.
OPTION_LIST_SIZE = 12


class Status(IntEnum):
    """What one hot-path call left in its slot """
    OK = 0            # lifted in full: branch 0's mask is in its row, post-return done
    LIFT = 1          # the call succeeded; Python lifts the rarer result and calls post-return
    TRAP = -1         # trap or wasmtime error (a host import's fault message is in the slot)
    BAD_ALLOC = -2    # cabi_realloc returned memory outside linear memory (detail: ptr, bytes)
    BAD_RESULT = -3   # the result record or branch list lies outside linear memory
    BAD_MASK_LEN = -4     # detail: words given, mask pointer
    BAD_MASK_RANGE = -5   # the mask lies outside linear memory; detail: ptr, words
    BAD_MASK_BITS = -6    # detail: first token id >= vocab size
    EMPTY_MASK = -7


class Stage(IntEnum):
    """Which guest code a failed call was running (for the message: where the fault was)."""
    INITIALIZE = 0    # `_initialize`, run on the worker before the first call
    ARGUMENTS = 1     # cabi_realloc for the arguments
    MID_PROCESS = 2
    POST = 3          # cabi_post_mid-process
    PREPARE = 4       # `aicirt_prepare`, run on the worker before the first call (after `_initialize`)
    PREPARE_TEMPLATE = 5   # `aicirt_prepare_template`, after it, on a request that makes a template

    @property
    def where(self) -> str:
        return {0: "_initialize", 1: "cabi_realloc (arguments)", 2: "mid-process", 3: "cabi_post_mid-process",
                4: EXPORT_PREPARE, 5: EXPORT_PREPARE_TEMPLATE}[self]


class RowStatus(IntEnum):
    """How the rows API took each row of a batch """
    STARTED = 0     # its call is queued
    STOPPED = 1     # finished or closed: no call
    LATE = 2        # its call from an earlier step is still out
    BAD_TOKEN = 3   # the sampled token is not an id of the vocabulary (detail[0])
    NO_MEMORY = 4   # its token buffer could not grow
    BAD_EDIT = 5    # its edit keeps more tokens than the controller saw


class RowKind(IntEnum):
    """What a row's result is, as the rows API returns it (`RowsOutcome.kind`)."""
    MASK = 0        # one branch: sample under `masks[row]` at `temperature[row]` (NaN: the request's own)
    PENDING = 1     # late: no-op this step; its result comes with a later step
    OTHER = 2       # anything else (splices, forks, stop, error, logs): `RowsOutcome.results[row]`


_LAYOUT_NAMES = [n for n in dir() if n.startswith(("BRANCH_", "SPLICE_", "RESULT_", "OPTION_"))]


def c_header() -> str:
    """``#define``s for the hot path's C (slot.c ... spawn.c): the layouts and status codes above, generated."""
    lines = ["/* generated from runtime/abi.py: do not edit */"]
    lines += [f"#define ABI_{n} {globals()[n]}" for n in _LAYOUT_NAMES]
    lines += [f"#define AICIRT_{s.name} ({s.value})" for s in Status]
    lines += [f"#define AICIRT_STAGE_{s.name} {s.value}" for s in Stage]
    lines += [f"#define ROW_{s.name} {s.value}" for s in RowStatus]
    lines += [f"#define KIND_{s.name} {s.value}" for s in RowKind]
    lines += [f"#define HOST_{name.upper().replace('-', '_')} {i}" for i, name in enumerate(HOST_IMPORTS)]
    return "\n".join(lines) + "\n"
