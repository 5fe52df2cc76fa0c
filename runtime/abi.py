"""The canonical-ABI lowering of world `controller` (SPEC §2): names, core signatures, layouts."""
from __future__ import annotations

HOST_MODULE = "aici:controller/host@0.1.0"
WASI_MODULE = "wasi_snapshot_preview1"

I32 = "i32"
# Core signatures (params, results) of the exports a controller must / may have.
EXPORT_MID_PROCESS = "mid-process"
EXPORT_REALLOC = "cabi_realloc"
EXPORT_POST = "cabi_post_mid-process"
EXPORT_INITIALIZE = "_initialize"
REQUIRED_FUNCS = {
    EXPORT_MID_PROCESS: ([I32] * 7, [I32]),
    EXPORT_REALLOC: ([I32] * 4, [I32]),
}
OPTIONAL_FUNCS = {
    EXPORT_POST: ([I32], []),
    EXPORT_INITIALIZE: ([], []),
}

# Host imports, lowered: lists/strings are (ptr, len); results that do not fit one core value
# go through a trailing return-area pointer.
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

# Record layouts (bytes).
BRANCH_SIZE = 28      # mask option: tag u8 @0, ptr @4, len @8; temperature: tag @12, f32 @16; splices ptr @20, len @24
SPLICE_SIZE = 20      # when-sampled ptr @0, len @4; backtrack @8; ff-tokens ptr @12, len @16
