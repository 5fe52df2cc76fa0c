"""Sampling for `aicirt.engine`: bitmask apply (vectorised) and seeded temperature/top-k/top-p.

Everything here is numpy on float32 logits `[rows, V]`; no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Temperatures at or below this sample greedily (argmax); it also avoids dividing by ~0.
GREEDY_BELOW = 1e-5
#: Most alternatives `SamplingParams.logprobs` may ask for per token (OpenAI's `top_logprobs` limit).
MAX_TOP_LOGPROBS = 20

#: One token's record: (its log-probability, ((token id, log-probability), ...) of the most likely).
TokenLogprob = tuple[float, tuple[tuple[int, float], ...]]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings.

    `temperature`: 0 = greedy; a branch may override it for one step. `top_k`: 0 = off.
    `top_p`: 1.0 = off. `max_tokens`: tokens appended to the sequence (sampled or fast-forwarded)
    before it finishes with reason "length" (a fast-forward past it is cut there). `seed`: None = nondeterministic. `max_idle_steps`:
    consecutive no-op steps before a sequence ends with an error (a controller waiting forever).
    `ignore_eos`: keep going after a sampled EOS (benchmarks that need a fixed token count).
    `stop`: strings that end a sequence (finish reason "stop") as soon as its output text holds
    one; its text is cut before the first of them (`find_stop`). `logprobs`: None = off; k >= 0
    records each appended token's log-probability and the k most likely tokens
    (`token_logprobs`; at most MAX_TOP_LOGPROBS) in `GenSeq.logprobs`.
    Raises `ValueError` for out-of-range values.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 64
    seed: int | None = None
    max_idle_steps: int = 1000
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stop, tuple) or not all(isinstance(x, str) and x for x in self.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be None or 0..{MAX_TOP_LOGPROBS}, got {self.logprobs!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens!r}")
        if self.max_idle_steps < 1:
            raise ValueError(f"max_idle_steps must be >= 1, got {self.max_idle_steps!r}")


def allowed_tokens(masks: np.ndarray, vocab_size: int) -> np.ndarray:
    """Unpack bitmask rows (uint32 `[rows, words]`, token t = bit t%32 of word t/32) to bool `[rows, vocab_size]`.

    Columns beyond the mask's `words * 32` come out False.
    """
    masks = np.ascontiguousarray(masks, dtype="<u4")  # the layout is defined on little-endian words
    bits = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little").view(bool)
    if bits.shape[1] >= vocab_size:
        return bits[:, :vocab_size]
    out = np.zeros((bits.shape[0], vocab_size), dtype=bool)
    out[:, : bits.shape[1]] = bits
    return out


def apply_masks(logits: np.ndarray, masks: np.ndarray) -> None:
    """Set every disallowed logit to -inf, in place. `logits` float `[rows, V]`, `masks` uint32 `[rows, words]`."""
    allowed = allowed_tokens(masks, logits.shape[1])
    np.copyto(logits, -np.inf, where=~allowed)


def sample(logits: np.ndarray, temperature: float, rng: np.random.Generator,
           top_k: int = 0, top_p: float = 1.0) -> int:
    """One token id from a float logits row `[V]` (-inf = forbidden).

    Greedy when `temperature` <= GREEDY_BELOW; otherwise softmax(logits / temperature) restricted
    to the `top_k` most likely tokens and the smallest set whose probability reaches `top_p`.
    Raises `ValueError` when every logit is -inf or NaN.
    """
    if temperature <= GREEDY_BELOW:
        token = int(np.argmax(logits))
        if not np.isfinite(logits[token]):
            raise ValueError("no token can be sampled: every logit is -inf or NaN")
        return token
    x = logits.astype(np.float64) / temperature
    candidates = np.flatnonzero(np.isfinite(x))
    if candidates.size == 0:
        raise ValueError("no token can be sampled: every logit is -inf or NaN")
    x = x[candidates]
    if 0 < top_k < candidates.size:
        keep = np.argpartition(x, -top_k)[-top_k:]
        candidates, x = candidates[keep], x[keep]
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cut = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
        keep = order[:cut]
        candidates, p = candidates[keep], p[keep] / p[keep].sum()
    return int(candidates[min(int(np.searchsorted(np.cumsum(p), rng.random(), side="right")), p.size - 1)])


def token_logprobs(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """`token`'s natural-log probability under softmax(`logits`) (temperature 1; -inf logits, the
    mask's, have probability 0) and the `top` most likely tokens, most likely first."""
    x = logits.astype(np.float64)
    m = float(np.max(x))
    lse = m + float(np.log(np.sum(np.exp(x - m))))
    alts: tuple[tuple[int, float], ...] = ()
    if top > 0:
        k = min(top, x.size)
        best = np.argpartition(-x, k - 1)[:k]
        best = best[np.argsort(-x[best], kind="stable")]
        alts = tuple((int(t), float(x[t] - lse)) for t in best if np.isfinite(x[t]))
    return float(x[token] - lse), alts


def forced_logprob(token: int, top: int) -> TokenLogprob:
    """The record of a token a controller fast-forwarded: under its constraint the only choice."""
    return 0.0, ((token, 0.0),) if top > 0 else ()


def find_stop(text: bytes, stops: tuple[str, ...]) -> int | None:
    """The byte offset in `text` where the earliest of `stops` begins, None when none occurs."""
    found = [i for i in (text.find(s.encode("utf-8")) for s in stops) if i >= 0]
    return min(found) if found else None


def partial_stop(text: bytes, stops: tuple[str, ...]) -> int:
    """How many bytes at the end of `text` could be the start of one of `stops` (a streaming
    client is sent the text before them only once the stop is ruled out)."""
    longest = 0
    for s in stops:
        b = s.encode("utf-8")
        for k in range(min(len(b) - 1, len(text)), longest, -1):
            if text.endswith(b[:k]):
                longest = k
                break
    return longest
