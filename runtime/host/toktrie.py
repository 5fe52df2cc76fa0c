"""The vocabulary's token trie as served by the host import `token-trie` (format: docs/token-trie.md).

The layout is chosen for the guest's mask walk, not for Python: nodes in DFS preorder, 8 bytes
each, so a controller can decide a whole subtree with one comparison and skip it with `i += size`.
"""
from __future__ import annotations

import struct
import sys
from array import array
from typing import Iterator, Sequence

MAGIC = 0x54544941          # b"AITT" read as a little-endian u32
VERSION = 1
HEADER = struct.Struct("<4I")  # magic, version, vocab_size, n_nodes
NO_TOKEN = 0xFFFFFF         # 24-bit token field: "no token ends here"
MAX_TOKEN_ID = NO_TOKEN - 1
MAX_DEPTH = (1 << 10) - 1   # 10-bit pop field bounds the token length
MAX_NODES = (1 << 22) - 1   # 22-bit subtree-size field


def serialize_trie(token_bytes: Sequence[bytes]) -> bytes:
    """Serialize the trie of `token_bytes` (token i's bytes are token_bytes[i]).

    Tokens with empty bytes (special tokens, EOS) are left out: they match no text, and a walk
    could never reach them. Tokens sharing a byte string all appear: the extra ids become leaf
    siblings with the same byte, placed just before the shared node, so the walk needs no special
    case for them.
    """
    if len(token_bytes) > MAX_TOKEN_ID + 1:
        raise ValueError(f"vocabulary of {len(token_bytes)} tokens is over the format's {MAX_TOKEN_ID + 1}")
    ids_of: dict[bytes, list[int]] = {}
    for tid, b in enumerate(token_bytes):
        if b:
            if len(b) > MAX_DEPTH:
                raise ValueError(f"token {tid} is {len(b)} bytes long; the format allows {MAX_DEPTH}")
            ids_of.setdefault(bytes(b), []).append(tid)
    prefixes = set()
    for b in ids_of:
        for i in range(1, len(b) + 1):
            prefixes.add(b[:i])
    # Sorted byte strings are exactly the DFS preorder with children in byte order.
    depth = [0]
    last = [0]
    tok = [NO_TOKEN]
    for p in sorted(prefixes):
        ids = ids_of.get(p, ())
        for extra in ids[1:]:          # duplicates: leaf siblings before the real node
            depth.append(len(p)); last.append(p[-1]); tok.append(extra)
        depth.append(len(p)); last.append(p[-1]); tok.append(ids[0] if ids else NO_TOKEN)
    n = len(depth)
    if n > MAX_NODES:
        raise ValueError(f"trie of {n} nodes is over the format's {MAX_NODES}")
    # size[i] = distance to the next node at the same or a smaller depth (end of i's subtree);
    # pop[i] = how many levels the walk climbs when it moves past i's subtree.
    words = array("I", bytes(8 * n))
    stack: list[int] = []
    for i in range(n + 1):
        d = depth[i] if i < n else 1   # the end acts as a node at depth 1 (stack back to the root)
        while stack and depth[stack[-1]] >= d:
            j = stack.pop()
            words[2 * j + 1] = ((i - j) << 10) | (depth[j] - d if depth[j] >= d else 0)
        if i < n:
            stack.append(i)
            words[2 * i] = (tok[i] << 8) | last[i]
    words[1] = n << 10                 # the root: its subtree is the whole trie
    if sys.byteorder != "little":
        words.byteswap()
    return HEADER.pack(MAGIC, VERSION, len(token_bytes), n) + words.tobytes()


def iter_tokens(blob: bytes) -> Iterator[tuple[int, bytes]]:
    """(token id, bytes) of every token in a serialized trie, in trie order: a reference reader."""
    magic, version, _vocab, n = HEADER.unpack_from(blob)
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a token trie (bad magic or version)")
    words = array("I", blob[HEADER.size:HEADER.size + 8 * n])
    if sys.byteorder != "little":
        words.byteswap()
    path = bytearray()
    for i in range(1, n):
        w0, w1 = words[2 * i], words[2 * i + 1]
        path.append(w0 & 0xFF)
        if (w0 >> 8) != NO_TOKEN:
            yield w0 >> 8, bytes(path)
        if (w1 >> 10) == 1:            # leaf: climb to the next node's parent
            del path[len(path) - 1 - (w1 & 0x3FF):]
