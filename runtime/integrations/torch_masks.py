"""Applying a :class:`~aicirt.integrations.steering.StepPlan` to a torch logits tensor, in place.

The plan's uint32 words are xgrammar's bitmask layout (viewed as int32), so all controlled rows are
masked in one call of xgrammar's own kernel (`apply_token_bitmask_inplace`; vLLM depends on
xgrammar): 0.2 ms for one 49k-token row here, against 15-20 ms for the same unpacking done with
torch tensor ops on a busy 2-core machine. Without xgrammar, numpy's `unpackbits` and one
`masked_fill_` do it. Logit columns past the mask (models often pad their vocabulary) are
disallowed too. Kept apart from the vLLM layer so another engine's layer (or one for vLLM's Model
Runner V2) can use it as is.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

#: Temperatures below this are greedy, as in vLLM's sampler.
GREEDY_EPS = 1e-5
#: Narrower logits are masked by the fallback (see mask_rows).
XGRAMMAR_MIN_VOCAB = 1024


def allowed_tokens(masks: np.ndarray, width: int, device: Any) -> torch.Tensor:
    """Bool [rows, width]: bit t of a row's words is set (False past the mask's own width)."""
    bits = np.unpackbits(np.ascontiguousarray(masks, dtype=np.uint32).view(np.uint8), axis=1, bitorder="little")
    allowed = torch.from_numpy(bits.view(np.bool_)).to(device)
    if allowed.shape[1] >= width:
        return allowed[:, :width]
    return torch.nn.functional.pad(allowed, (0, width - allowed.shape[1]), value=False)


def _xgrammar_kernel() -> Callable[..., Any] | None:
    try:
        import xgrammar
    except ImportError:
        return None
    return xgrammar.apply_token_bitmask_inplace


def mask_rows(logits: torch.Tensor, rows: list[int], masks: np.ndarray) -> None:
    """Set `logits[rows[k], t] = -inf` wherever bit t of `masks[k]` is clear."""
    width = masks.shape[1] * 32
    # xgrammar 0.2.8's CPU kernel masks wrong rows (and once corrupted the heap) at tiny vocabularies
    # (4 or 33 tokens, tried here); at real ones (1k-152k, padded or not) it agreed with the fallback
    # in 200 random trials: tests/test_vllm_torch_masks.py checks that.
    kernel = _xgrammar_kernel() if logits.shape[1] >= XGRAMMAR_MIN_VOCAB else None
    if kernel is not None and logits.dtype == torch.float32 and logits.is_contiguous():
        # The kernel pairs logits row i with bitmask row i: place each mask at its row (others: all set).
        full = np.full((logits.shape[0], masks.shape[1]), -1, dtype=np.int32)
        full[rows] = np.ascontiguousarray(masks, dtype=np.uint32).view(np.int32)
        bitmask = torch.from_numpy(full).to(logits.device)
        kernel(logits, bitmask, vocab_size=min(width, logits.shape[1]), indices=list(rows),
               backend="cpu" if logits.device.type == "cpu" else "auto")
        if logits.shape[1] > width:
            logits[torch.tensor(rows, device=logits.device), width:] = float("-inf")
        return
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    sub = logits.index_select(0, index)
    sub.masked_fill_(~allowed_tokens(masks, sub.shape[1], logits.device), float("-inf"))
    logits.index_copy_(0, index, sub)


def apply_plan(logits: torch.Tensor, rows: list[int], masks: np.ndarray, temperatures: list[float | None],
               request_temperatures: list[float], exact_scaling: list[bool]) -> list[int]:
    """Mask `logits[rows[k]]` with `masks[k]` in place, then apply branch temperatures where exact.

    A branch temperature T' is exact when it is greedy (only the argmax is kept, whatever the
    request samples with), or when the request samples at T > 0 and `exact_scaling[k]` says the
    host divides by T after this (so scaling by T/T' gives T'). Returns the k whose temperature
    could not be applied (a greedy request asked for T' > 0, or additive penalties follow).
    """
    if not rows:
        return []
    mask_rows(logits, rows, masks)
    skipped = []
    for k, t in enumerate(temperatures):
        if t is None:
            continue
        row = logits[rows[k]]
        if t < GREEDY_EPS:
            best = int(torch.argmax(row))
            keep = row[best].clone()
            row.fill_(float("-inf"))
            row[best] = keep
        elif request_temperatures[k] >= GREEDY_EPS and exact_scaling[k]:
            row.mul_(request_temperatures[k] / t)
        else:
            skipped.append(k)
    return skipped
