"""Tokenizer adapters: what the host imports (`tokenize`, `detokenize`, `token-trie`) need.

The runtime needs four things from a tokenizer: the vocabulary size, the EOS token, each token's
bytes (for the token trie), and text -> ids. Any object with these attributes works
(:class:`Tokenizer` is the protocol); two adapters ship: :class:`ByteTokenizer` (one token per byte,
for tests) and :class:`HFTokenizer` (a Hugging Face ``tokenizers.Tokenizer``).
"""
from __future__ import annotations

import json
from functools import cached_property
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    import tokenizers

TokenId = int


class Tokenizer(Protocol):
    vocab_size: int
    eos_token_id: TokenId

    @property
    def token_bytes(self) -> list[bytes]:
        """Bytes of every token id; special tokens map to b''."""

    def encode(self, text: str) -> list[TokenId]: ...

    def decode_bytes(self, ids: Sequence[TokenId]) -> bytes: ...


class ByteTokenizer:
    """Token i < 256 is byte i; token 256 is EOS. Deterministic and tiny: for tests."""

    vocab_size = 257
    eos_token_id = 256

    @cached_property
    def token_bytes(self) -> list[bytes]:
        return [bytes([i]) for i in range(256)] + [b""]

    def encode(self, text: str) -> list[TokenId]:
        return list(text.encode("utf-8"))

    def decode_bytes(self, ids: Sequence[TokenId]) -> bytes:
        return bytes(i for i in ids if i < 256)


def byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-character stand-ins for bytes, inverted (char -> byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class HFTokenizer:
    """Adapter over a Hugging Face ``tokenizers.Tokenizer`` (byte-level BPE or SentencePiece-style).

    ``eos_token_id`` defaults to the id of the first of ``</s>``, ``<|endoftext|>``,
    ``<|im_end|>``, ``<|end_of_text|>`` found in the vocabulary; raises ValueError if none is.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, eos_token_id: TokenId | None = None) -> None:
        self.tk = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        if eos_token_id is None:
            for name in ("<|endoftext|>", "</s>", "<|im_end|>", "<|end_of_text|>", "<eos>"):
                eos_token_id = tokenizer.token_to_id(name)
                if eos_token_id is not None:
                    break
            else:
                raise ValueError("cannot tell the EOS token: pass eos_token_id")
        if not 0 <= eos_token_id < self.vocab_size:
            raise ValueError(f"eos_token_id {eos_token_id} is outside the vocabulary (size {self.vocab_size})")
        self.eos_token_id = eos_token_id

    @classmethod
    def from_file(cls, path: str, eos_token_id: TokenId | None = None) -> "HFTokenizer":
        from tokenizers import Tokenizer as _Tk
        return cls(_Tk.from_file(str(path)), eos_token_id)

    @cached_property
    def token_bytes(self) -> list[bytes]:
        spec = json.loads(self.tk.to_str())
        decoder = json.dumps(spec.get("decoder") or {})
        byte_level = "ByteLevel" in decoder
        inv = byte_level_decoder()
        special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
        out: list[bytes] = []
        for i in range(self.vocab_size):
            piece = self.tk.id_to_token(i)
            if piece is None or i in special:
                out.append(b"")
            elif byte_level:
                try:
                    out.append(bytes(inv[c] for c in piece))
                except KeyError:  # an added non-special token stored as plain text
                    out.append(piece.encode("utf-8"))
            elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(bytes([int(piece[3:5], 16)]))
            else:
                out.append(piece.replace("\u2581", " ").encode("utf-8"))
        return out

    def encode(self, text: str) -> list[TokenId]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def decode_bytes(self, ids: Sequence[TokenId]) -> bytes:
        tb = self.token_bytes
        return b"".join(tb[i] for i in ids if 0 <= i < self.vocab_size)
