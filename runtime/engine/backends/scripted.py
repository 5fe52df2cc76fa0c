"""A deterministic fake model for tests: logits are a pure function of the sequence's tokens.

Its "KV cache" is the list of tokens it has been given, so tests can check that the engine keeps
every cache equal to a prefix of its sequence (the invariant real caches depend on), and
`calls` records every forward batch. No torch; a forward costs microseconds.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .base import Backend, KVCache, TokenId

if TYPE_CHECKING:
    from ...host.tokenizer import Tokenizer

LogitsFn = Callable[[tuple[TokenId, ...]], np.ndarray]


class ScriptedBackend(Backend):
    """Fake model over `tokenizer` (default: the runtime's `ByteTokenizer`, 257 tokens).

    Logits for a token list come from, in order of precedence:
    - `logits_fn(tokens) -> float array [vocab_size]`;
    - `script`: a token list or str (encoded); the model prefers `script[len(tokens) % len(script)]`
      by a wide margin (+20) over seeded noise, so greedy decoding reproduces the script;
    - otherwise seeded noise, a function of `seed` and the tokens.
    `forward_delay_s` sleeps in each forward (simulating a model so controllers overlap with it).
    """

    name = "scripted"

    def __init__(self, tokenizer: Tokenizer | None = None, *, seed: int = 0,
                 script: str | Sequence[TokenId] | None = None, logits_fn: LogitsFn | None = None,
                 forward_delay_s: float = 0.0) -> None:
        if tokenizer is None:
            from aicirt import ByteTokenizer

            tokenizer = ByteTokenizer()
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.seed = seed
        if isinstance(script, str):
            script = tokenizer.encode(script)
        self.script = list(script) if script is not None else None
        if self.script is not None and not self.script:
            raise ValueError("script must not be empty")
        self.logits_fn = logits_fn
        self.forward_delay_s = forward_delay_s
        #: One entry per forward call: [(cache uid, tokens appended), ...].
        self.calls: list[list[tuple[int, tuple[TokenId, ...]]]] = []
        self._uids = 0

    def runtime_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    def encode(self, text: str) -> list[TokenId]:
        return list(self.tokenizer.encode(text))

    def decode_bytes(self, tokens: Sequence[TokenId]) -> bytes:
        return bytes(self.tokenizer.decode_bytes(list(tokens)))

    # --- logits ----------------------------------------------------------------------------
    def noise(self, tokens: tuple[TokenId, ...]) -> np.ndarray:
        """Seeded standard-normal logits for `tokens` (same tokens, same seed: same logits)."""
        key = zlib.crc32(np.asarray(tokens, dtype=np.uint32).tobytes())
        return np.random.default_rng([self.seed, key]).standard_normal(self.vocab_size).astype(np.float32)

    def logits_for(self, tokens: tuple[TokenId, ...]) -> np.ndarray:
        if self.logits_fn is not None:
            return np.asarray(self.logits_fn(tokens), dtype=np.float32)
        out = self.noise(tokens)
        if self.script is not None:
            out[self.script[len(tokens) % len(self.script)]] += 20.0
        return out

    # --- caches ----------------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        self._uids += 1
        return KVCache(0, {"uid": self._uids, "tokens": []})

    def forward(self, batch: Sequence[tuple[KVCache, Sequence[TokenId]]]) -> np.ndarray:
        self._check_batch(batch)
        if self.forward_delay_s:
            import time

            time.sleep(self.forward_delay_s)
        out = np.empty((len(batch), self.vocab_size), dtype=np.float32)
        record = []
        for i, (cache, tokens) in enumerate(batch):
            cache.state["tokens"].extend(int(t) for t in tokens)
            cache.length = len(cache.state["tokens"])
            out[i] = self.logits_for(tuple(cache.state["tokens"]))
            record.append((cache.state["uid"], tuple(int(t) for t in tokens)))
        self.calls.append(record)
        return out

    def backtrack(self, cache: KVCache, length: int) -> None:
        self._check_backtrack(cache, length)
        del cache.state["tokens"][length:]
        cache.length = length

    def fork(self, cache: KVCache) -> KVCache:
        if cache.freed:
            raise ValueError("cache already freed")
        self._uids += 1
        return KVCache(cache.length, {"uid": self._uids, "tokens": list(cache.state["tokens"])})

    @staticmethod
    def cached_tokens(cache: KVCache) -> list[TokenId]:
        """What the fake cache holds (tests compare it with the sequence's tokens)."""
        return list(cache.state["tokens"])
