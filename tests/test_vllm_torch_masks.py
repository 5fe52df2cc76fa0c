"""aicirt.integrations.torch_masks: a StepPlan applied to torch logits (needs torch, not vLLM)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from aicirt.integrations import torch_masks  # noqa: E402
from aicirt.integrations.torch_masks import MaskBiases, apply_plan, mask_bias, mask_rows  # noqa: E402


@pytest.fixture(params=["kernel", "bias"])
def path(request, monkeypatch):
    """Each CPU float32 masking path: the C kernel, and the bias rows used where it cannot be built."""
    if request.param == "kernel":
        assert torch_masks.kernel() is not None, "the masking kernel did not build"
    else:
        monkeypatch.setattr(torch_masks, "_kernel_mod", None)
        monkeypatch.setattr(torch_masks, "_kernel_tried", True)
    return request.param


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
def test_masking_agrees_with_the_bits_at_real_vocabularies(vocab, path):
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
    if path == "bias":
        assert biases.hits > 0 and biases.misses > 0
    else:   # the kernel looks nothing up
        assert biases.hits == biases.misses == 0


def test_masking_a_strided_view_writes_only_its_own_columns(path):
    # logits that are a view of a wider buffer (row stride > width): the columns past it stay
    rng = np.random.default_rng(7)
    big = torch.randn(5, 200)
    before = big.clone()
    logits = big[:, :150]
    masks = rng.integers(0, 2**32, size=(2, 5), dtype=np.uint64).astype(np.uint32)
    mask_rows(logits, [4, 1], masks)
    assert torch.equal(big[:, 150:], before[:, 150:])
    for k, r in enumerate([4, 1]):
        keep = torch.from_numpy(allowed(masks[k:k + 1], 150)[0])
        assert torch.equal(logits[r][keep], before[r, :150][keep]) and torch.isneginf(logits[r][~keep]).all()
    for r in (0, 2, 3):
        assert torch.equal(big[r], before[r])


def test_a_column_strided_tensor_takes_the_bias_path_with_the_same_result():
    rng = np.random.default_rng(3)
    masks = rng.integers(0, 2**32, size=(3, 4), dtype=np.uint64).astype(np.uint32)
    dense = torch.randn(3, 100)
    strided = dense.t().contiguous().t()              # same values, column stride 3
    assert strided.stride(1) != 1
    mask_rows(dense, [0, 1, 2], masks)
    mask_rows(strided, [0, 1, 2], masks)
    assert torch.equal(dense, strided)


def test_kernel_refuses_rows_outside_the_logits_and_too_few_masks():
    assert torch_masks.kernel() is not None
    logits = torch.zeros(2, 64)
    with pytest.raises(ValueError, match="not all rows"):
        mask_rows(logits, [0, 2], np.zeros((2, 2), dtype=np.uint32))
    with pytest.raises(ValueError, match="not all rows"):
        mask_rows(logits, [-1], np.zeros((1, 2), dtype=np.uint32))
    with pytest.raises(ValueError, match="mask matrix"):
        mask_rows(logits, [0, 1], np.zeros((1, 2), dtype=np.uint32))
    assert torch.equal(logits, torch.zeros(2, 64))


def test_kernel_masks_infinite_and_nan_logits_too():
    logits = torch.tensor([[float("inf"), float("nan"), 1.0, float("-inf")] * 8])
    mask_rows(logits, [0], mask_of([2, 3, 4], 1)[None])
    assert torch.isneginf(logits[0, [0, 1, 5, 6]]).all()
    assert logits[0, 2] == 1.0 and logits[0, 4] == float("inf")


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
