"""aicirt.integrations.torch_masks: a StepPlan applied to torch logits (needs torch, not vLLM)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from aicirt.integrations.torch_masks import MaskBiases, apply_plan, mask_bias, mask_rows  # noqa: E402


def mask_of(tokens, words: int) -> np.ndarray:
    row = np.zeros(words, dtype=np.uint32)
    for t in tokens:
        row[t >> 5] |= np.uint32(1 << (t & 31))
    return row


def allowed(masks: np.ndarray, width: int) -> np.ndarray:
    """The reference: bool [rows, width] from the bits, False past the mask."""
    bits = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little").astype(bool)
    out = np.zeros((masks.shape[0], width), dtype=bool)
    n = min(width, bits.shape[1])
    out[:, :n] = bits[:, :n]
    return out


def test_bias_follows_xgrammar_layout_including_the_sign_bit_and_pads_past_the_mask():
    bias = mask_bias(mask_of([0, 31, 32, 63], 2), 70)
    assert bias.dtype == np.float32 and bias.shape == (70,)
    assert np.flatnonzero(bias == 0).tolist() == [0, 31, 32, 63]
    assert np.isneginf(np.delete(bias, [0, 31, 32, 63])).all()
    assert np.flatnonzero(mask_bias(mask_of([5, 40], 2), 33) == 0).tolist() == [5]   # cut to the width


def test_masks_only_the_controlled_rows_and_columns_past_the_vocabulary():
    logits = torch.randn(4, 70)
    before = logits.clone()
    masks = np.stack([mask_of([3, 40], 2), mask_of([0, 63], 2)])
    skipped = apply_plan(logits, [1, 3], masks, [None, None], [0.0, 0.0], [True, True])
    assert skipped == []
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [3, 40]
    assert torch.isfinite(logits[3]).nonzero().flatten().tolist() == [0, 63]
    assert logits[1, 3] == before[1, 3] and logits[3, 63] == before[3, 63]


def test_branch_temperature_applied_only_where_exact():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]] * 4)
    masks = np.stack([mask_of([0, 1, 2, 3], 1)] * 4)
    # row 0: greedy branch on a sampling request: only the argmax stays
    # row 1: T'=0.5 on a request at T=1: scaled by 2 (the host divides by 1 next)
    # row 2: T'=0.5 on a greedy request: cannot be made exact -> skipped
    # row 3: T'=0.5 with additive penalties after us -> skipped
    skipped = apply_plan(logits, [0, 1, 2, 3], masks, [0.0, 0.5, 0.5, 0.5], [1.0, 1.0, 0.0, 1.0],
                         [True, True, True, False])
    assert skipped == [2, 3]
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [2]
    assert torch.allclose(logits[1], torch.tensor([2.0, 4.0, 6.0, 1.0]))
    assert torch.equal(logits[2], torch.tensor([1.0, 2.0, 3.0, 0.5]))


@pytest.mark.parametrize("vocab", [70, 1024, 49152, 49152 + 64, 50257, 151936])
def test_masking_agrees_with_the_bits_at_real_vocabularies(vocab):
    rng = np.random.default_rng(vocab)
    words = (min(vocab, 151936) + 31) // 32
    biases = MaskBiases()
    for n in (1, 3, 8):
        rows = sorted(rng.choice(n, size=max(1, n - 1), replace=False).tolist())
        masks = rng.integers(0, 2**32, size=(len(rows), words), dtype=np.uint64).astype(np.uint32)
        for cache in (biases, biases, None):   # built, then from the cache, then uncached
            logits = torch.randn(n, vocab)
            before = logits.clone()
            mask_rows(logits, rows, masks, cache)
            keep = np.ones((n, vocab), dtype=bool)
            keep[rows] = allowed(masks, vocab)
            assert torch.equal(logits[torch.from_numpy(keep)], before[torch.from_numpy(keep)])
            assert torch.isneginf(logits[torch.from_numpy(~keep)]).all()
    assert biases.hits > 0 and biases.misses > 0


def test_the_cache_keeps_a_mask_seen_before_within_its_bound():
    words = mask_of([1, 2], 4)
    logits = torch.zeros(2, 128)
    biases = MaskBiases(max_bytes=2 * 128 * 4)           # room for two rows
    first = biases.bias(words, logits)
    assert biases.bias(words.copy(), logits) is first     # same content: the same row
    biases.bias(mask_of([3], 4), logits)
    biases.bias(mask_of([4], 4), logits)                  # a third: the least recently used goes
    assert biases.bias(words, logits) is not first and biases.misses == 4
    assert biases.bias(words, torch.zeros(1, 128, dtype=torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="max_bytes"):
        MaskBiases(-1)
