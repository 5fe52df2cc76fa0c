"""The one interface a model backend implements for `aicirt.engine`.

A backend owns the model and one KV cache per sequence; the engine owns everything else
(controllers, sampling, splices). The engine keeps each cache's contents equal to a prefix of
its sequence's token list, so a backend never needs to know about controllers:

- `forward` appends tokens to caches and returns the logits after the last appended token,
- `backtrack` crops a cache to a shorter length (splices that remove tokens),
- `fork` copies a cache (a controller forked the sequence),
- `free` releases it.
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TokenId = int


@dataclass(eq=False)
class KVCache:
    """A handle to one sequence's cache. `length` is the number of tokens it holds.

    `state` is the backend's own data (a transformers `DynamicCache`, a token list, a llama.cpp
    sequence id); the engine never looks inside it.
    """

    length: int = 0
    state: Any = field(default=None, repr=False)
    freed: bool = False


class Backend(abc.ABC):
    """A model: tokenizer plus batched forward over per-sequence KV caches.

    Subclasses set `name`, `vocab_size` (width of a logits row, may exceed the tokenizer's
    vocabulary, as padded embedding matrices do) and `eos_token_id`.
    """

    name: str = "backend"
    vocab_size: int
    eos_token_id: TokenId

    # --- tokenizer -------------------------------------------------------------------------
    @abc.abstractmethod
    def runtime_tokenizer(self) -> Any:
        """The tokenizer object to give `aicirt.Runtime` (`HFTokenizer` or `ByteTokenizer`)."""

    @abc.abstractmethod
    def encode(self, text: str) -> list[TokenId]:
        """Tokens for `text`, without special tokens."""

    @abc.abstractmethod
    def decode_bytes(self, tokens: Sequence[TokenId]) -> bytes:
        """UTF-8 bytes of `tokens` (may end in the middle of a character)."""

    def format_prompt(self, prompt: str, *, chat: bool = True) -> list[TokenId]:
        """Tokens of a user prompt; chat models wrap it in their chat template when `chat`."""
        return self.encode(prompt)

    # --- caches ----------------------------------------------------------------------------
    @abc.abstractmethod
    def new_cache(self) -> KVCache:
        """An empty cache (length 0)."""

    @abc.abstractmethod
    def forward(self, batch: Sequence[tuple[KVCache, Sequence[TokenId]]]) -> np.ndarray:
        """Append each entry's tokens to its cache and return float32 logits `[len(batch), vocab_size]`.

        Row i holds the logits that follow the last token of entry i. Each entry must append at
        least one token and each cache may appear once. Raises `ValueError` otherwise.
        """

    @abc.abstractmethod
    def backtrack(self, cache: KVCache, length: int) -> None:
        """Crop `cache` to its first `length` tokens. Raises `ValueError` if `length` is out of range."""

    @abc.abstractmethod
    def fork(self, cache: KVCache) -> KVCache:
        """A new, independent cache with the same contents as `cache`."""

    def free(self, cache: KVCache) -> None:
        """Release a cache; idempotent. Using it afterwards raises `ValueError`."""
        cache.state = None
        cache.freed = True
        cache.length = 0

    def close(self) -> None:
        """Release the model. Idempotent."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- shared checks ---------------------------------------------------------------------
    @staticmethod
    def _check_batch(batch: Sequence[tuple[KVCache, Sequence[TokenId]]]) -> None:
        seen: set[int] = set()
        for cache, tokens in batch:
            if cache.freed:
                raise ValueError("cache already freed")
            if id(cache) in seen:
                raise ValueError("a cache appears twice in one forward batch")
            seen.add(id(cache))
            if len(tokens) == 0:
                raise ValueError("forward needs at least one new token per sequence")

    @staticmethod
    def _check_backtrack(cache: KVCache, length: int) -> None:
        if cache.freed:
            raise ValueError("cache already freed")
        if not 0 <= length <= cache.length:
            raise ValueError(f"cannot crop a cache of {cache.length} tokens to {length}")
