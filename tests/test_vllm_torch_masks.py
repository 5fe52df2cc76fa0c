"""aicirt.integrations.torch_masks: a StepPlan applied to torch logits (needs torch, not vLLM)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from aicirt.integrations import torch_masks  # noqa: E402
from aicirt.integrations.torch_masks import allowed_tokens, apply_plan  # noqa: E402


def mask_of(tokens, words: int) -> np.ndarray:
    row = np.zeros(words, dtype=np.uint32)
    for t in tokens:
        row[t >> 5] |= np.uint32(1 << (t & 31))
    return row


def test_unpacks_xgrammar_layout_including_the_sign_bit_and_pads_past_the_mask():
    masks = np.stack([mask_of([0, 31, 32, 63], 2), mask_of([5], 2)])
    bits = allowed_tokens(masks, 70, "cpu")
    assert bits.shape == (2, 70)
    assert torch.nonzero(bits[0]).flatten().tolist() == [0, 31, 32, 63]
    assert torch.nonzero(bits[1]).flatten().tolist() == [5]


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


@pytest.mark.parametrize("vocab", [49152, 49152 + 64, 50257, 151936, 1024])
def test_xgrammar_kernel_agrees_with_the_fallback(vocab, monkeypatch):
    if torch_masks._xgrammar_kernel() is None:
        pytest.skip("xgrammar is not installed")
    rng = np.random.default_rng(vocab)
    words = (min(vocab, 151936) + 31) // 32
    for n in (1, 3, 8):
        rows = sorted(rng.choice(n, size=max(1, n - 1), replace=False).tolist())
        masks = rng.integers(0, 2**32, size=(len(rows), words), dtype=np.uint64).astype(np.uint32)
        if vocab % 32 and vocab <= words * 32:
            masks[:, -1] &= np.uint32((1 << (vocab % 32)) - 1)
        logits = torch.randn(n, vocab)
        fast, slow = logits.clone(), logits.clone()
        torch_masks.mask_rows(fast, rows, masks)
        with monkeypatch.context() as m:
            m.setattr(torch_masks, "_xgrammar_kernel", lambda: None)
            torch_masks.mask_rows(slow, rows, masks)
        assert torch.equal(fast, slow)
