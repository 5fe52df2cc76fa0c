"""Applying a :class:`~aicirt.integrations.steering.StepPlan` to a torch logits tensor.

One vectorised pass for all controlled rows: the uint32 words (xgrammar's bitmask layout, viewed
as int32) are unpacked on the logits' device and disallowed tokens set to -inf. Logit columns past
the tokenizer's vocabulary (models often pad it) are disallowed too. Kept apart from the vLLM
layer so that another engine's layer (or vLLM's Model Runner V2) can use it as is.
"""
from __future__ import annotations

import numpy as np
import torch

#: Temperatures below this are greedy, as in vLLM's sampler.
GREEDY_EPS = 1e-5


def allowed_tokens(masks: np.ndarray, width: int, device) -> torch.Tensor:
    """Bool [rows, width]: bit t of a row's words is set (False past the mask's own width)."""
    words = torch.from_numpy(np.ascontiguousarray(masks).view(np.int32)).to(device, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    bits = ((words.unsqueeze(-1) >> shifts) & 1).to(torch.bool).flatten(1)
    if bits.shape[1] >= width:
        return bits[:, :width]
    return torch.nn.functional.pad(bits, (0, width - bits.shape[1]), value=False)


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
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    sub = logits.index_select(0, index)
    sub.masked_fill_(~allowed_tokens(masks, sub.shape[1], logits.device), float("-inf"))
    skipped = []
    for k, t in enumerate(temperatures):
        if t is None:
            continue
        if t < GREEDY_EPS:
            best = int(torch.argmax(sub[k]))
            keep = sub[k, best].clone()
            sub[k].fill_(float("-inf"))
            sub[k, best] = keep
        elif request_temperatures[k] >= GREEDY_EPS and exact_scaling[k]:
            sub[k].mul_(request_temperatures[k] / t)
        else:
            skipped.append(k)
    logits.index_copy_(0, index, sub)
    return skipped
