"""Applying a :class:`~aicirt.integrations.steering.StepPlan` to a torch logits tensor, in place.

CPU float32 logits (vLLM's CPU build) are masked by a small C kernel (`mask_kernel.c`, built once
with cffi like the runtime's hot path, see `kernel`): all controlled rows in one call on the
calling thread, each row one pass writing -inf wherever its mask bit is clear (and past the mask's
width: models often pad their vocabulary), with nothing to look up or build per mask. torch's own
ops would split each row over its OpenMP pool, which on a loaded machine waits for descheduled
threads (ms a row).

Elsewhere (another dtype or device, e.g. a GPU, or no C compiler), each mask row becomes an additive
bias row of the logits' width, dtype and device (0 where the token is allowed, -inf where not),
added in place (numpy's add for CPU float32, torch's `add_` otherwise). Building a bias costs one
`np.unpackbits` and one integer multiply (the bit pattern of -inf is written directly);
:class:`MaskBiases` keeps built biases by mask content, so a mask the controller has cached (the
same words again) costs a hash of its words and the add only. Either way a logit of +inf where the
mask disallows becomes -inf (kernel) or NaN (bias).

Measured on a busy 2-core machine, [8, 49152] float32 logits (caller's CPU a row): the kernel and
a cached bias's numpy add cost the same (35-45 µs at load 8: the row's memory traffic; the kernel
reads no bias row but hashes no mask either); building a bias costs about 35 µs, `masked_fill_`
with a bool mask 1 ms for the batch, and xgrammar's CPU bitmask kernel about 0.2 ms a row. Kept
apart from the vLLM layer so another engine's layer (or one for vLLM's Model Runner V2) can use it
as is.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("aicirt.integrations")

#: Temperatures below this are greedy, as in vLLM's sampler.
GREEDY_EPS = 1e-5
#: What the bias cache may hold, in bytes (then the least recently used bias goes).
MASK_CACHE_BYTES = 32 << 20

_NEG_INF_BITS = np.uint32(0xFF800000)   # float32 -inf


def mask_bias(words: np.ndarray, width: int) -> np.ndarray:
    """Float32 [width]: 0.0 where bit t of `words` is set, -inf elsewhere (and past the mask)."""
    off = np.unpackbits((~np.ascontiguousarray(words, dtype=np.uint32)).view(np.uint8), bitorder="little")
    bias = np.full(width, -np.inf, dtype=np.float32)
    n = min(width, off.shape[0])
    np.multiply(off[:n], _NEG_INF_BITS, out=bias[:n].view(np.uint32), dtype=np.uint32)
    return bias


class MaskBiases:
    """Bias rows (see `mask_bias`) for logits of one width, dtype and device, kept by mask content
    up to `max_bytes` (least recently used out first). `max_bytes=0` keeps none. Raises
    ValueError for a negative bound."""

    def __init__(self, max_bytes: int = MASK_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._key: tuple = ()
        self._rows: OrderedDict[bytes, tuple[torch.Tensor, np.ndarray | None]] = OrderedDict()
        self.hits = self.misses = 0

    def bias(self, words: np.ndarray, logits: torch.Tensor) -> torch.Tensor:
        """The bias row of `words` for `logits`' width, dtype and device."""
        return self._entry(words, logits)[0]

    def array(self, words: np.ndarray, logits: torch.Tensor) -> np.ndarray:
        """The same row as a float32 numpy array (sharing its memory). Raises ValueError unless
        `logits` is a CPU float32 tensor."""
        row = self._entry(words, logits)[1]
        if row is None:
            raise ValueError(f"a numpy bias needs CPU float32 logits, got {logits.dtype} on {logits.device}")
        return row

    def arrays(self, masks: np.ndarray, logits: torch.Tensor) -> list[np.ndarray]:
        """`array` for each row of `masks` (the logits' width, dtype and device looked at once)."""
        self._check(logits)
        out = []
        for words in masks:
            row = self._lookup(words, logits)[1]
            if row is None:
                raise ValueError(f"a numpy bias needs CPU float32 logits, got {logits.dtype} on {logits.device}")
            out.append(row)
        return out

    def _check(self, logits: torch.Tensor) -> None:
        key = (logits.shape[1], logits.dtype, logits.device)
        if key != self._key:
            self._key, self._rows = key, OrderedDict()

    def _entry(self, words: np.ndarray, logits: torch.Tensor) -> tuple[torch.Tensor, np.ndarray | None]:
        """(the bias as a tensor, the same memory as a float32 numpy array where it is one)."""
        self._check(logits)
        return self._lookup(words, logits)

    def _lookup(self, words: np.ndarray, logits: torch.Tensor) -> tuple[torch.Tensor, np.ndarray | None]:
        content = words.tobytes()
        entry = self._rows.get(content)
        if entry is not None:
            self._rows.move_to_end(content)
            self.hits += 1
            return entry
        self.misses += 1
        row = torch.from_numpy(mask_bias(words, logits.shape[1])).to(device=logits.device, dtype=logits.dtype)
        entry = (row, row.numpy() if _numpy_ok(row) else None)
        size = row.numel() * row.element_size()
        if size <= self.max_bytes:
            while self._rows and (len(self._rows) + 1) * size > self.max_bytes:
                self._rows.popitem(last=False)
            self._rows[content] = entry
        return entry


def _numpy_ok(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype == torch.float32 and not t.requires_grad


_KERNEL_CDEF = """void aicirt_mask_rows_f32(float *logits, int64_t row_stride, const int64_t *rows, int64_t n,
                          const uint32_t *masks, int64_t words, int64_t width);"""
_kernel_lock = threading.Lock()
_kernel_mod: Any = None
_kernel_tried = False


def kernel() -> Any:
    """The compiled masking kernel (`mask_kernel.c`, a cffi module with ``.ffi`` and ``.lib``),
    built on first use and cached on disk like the runtime's hot path; None where it cannot be
    built (no C compiler: then the bias path is used, and a warning says so once)."""
    global _kernel_mod, _kernel_tried
    if _kernel_tried:
        return _kernel_mod
    with _kernel_lock:
        if not _kernel_tried:
            from ..native.build import build_cached
            try:
                source = (Path(__file__).resolve().parent / "mask_kernel.c").read_text()
                _kernel_mod = build_cached("_aicirt_masks", source, _KERNEL_CDEF)
            except Exception as e:   # no compiler, no cache dir: the numpy/torch path still works
                log.warning("the masking kernel could not be built (%s: %s); masking by bias rows instead",
                            type(e).__name__, e)
            _kernel_tried = True
    return _kernel_mod


def _kernel_mask(mod: Any, logits: torch.Tensor, rows: list[int], masks: np.ndarray) -> None:
    n = len(rows)
    if masks.ndim != 2 or masks.shape[0] < n:
        raise ValueError(f"{n} rows need a mask matrix of at least {n} rows, got shape {masks.shape}")
    if min(rows) < 0 or max(rows) >= logits.shape[0]:
        raise ValueError(f"rows {rows} are not all rows of logits of shape {tuple(logits.shape)}")
    masks = np.ascontiguousarray(masks[:n], dtype=np.uint32)
    index = np.asarray(rows, dtype=np.int64)
    ffi = mod.ffi
    mod.lib.aicirt_mask_rows_f32(ffi.cast("float *", logits.data_ptr()), logits.stride(0),
                                 ffi.from_buffer("int64_t[]", index), n, ffi.from_buffer("uint32_t[]", masks),
                                 masks.shape[1], logits.shape[1])


def mask_rows(logits: torch.Tensor, rows: list[int], masks: np.ndarray, biases: MaskBiases | None = None) -> None:
    """Set `logits[rows[k], t] = -inf` wherever bit t of `masks[k]` is clear (and past the mask's
    width), in place. `logits` is [batch, width]; `masks` uint32 [len(rows), words]. CPU float32
    logits with unit column stride go through `kernel` (where it builds); otherwise `biases`
    keeps the built bias rows between calls (None: built each call). Raises ValueError for a row
    outside `logits` or too few mask rows (kernel path)."""
    if not rows:
        return
    if _numpy_ok(logits) and logits.dim() == 2 and logits.stride(1) == 1:
        mod = kernel()
        if mod is not None:
            _kernel_mask(mod, logits, rows, masks)
            return
    biases = biases if biases is not None else MaskBiases(0)
    if _numpy_ok(logits):
        # numpy on CPU float32: one thread, no OpenMP parallel region (torch splits a 49k-element
        # add over its pool, which on a loaded machine waits for descheduled threads: ms a row)
        view = logits.numpy()
        for r, bias in zip(rows, biases.arrays(masks, logits)):
            out = view[r]
            np.add(out, bias, out=out)
        return
    for k, r in enumerate(rows):
        logits[r].add_(biases.bias(masks[k], logits))


def apply_plan(logits: torch.Tensor, rows: list[int], masks: np.ndarray, temperatures: list[float | None],
               request_temperatures: list[float], exact_scaling: list[bool],
               biases: MaskBiases | None = None) -> list[int]:
    """Mask `logits[rows[k]]` with `masks[k]` in place, then apply branch temperatures where exact.

    A branch temperature T' is exact when it is greedy (only the argmax is kept, whatever the
    request samples with), or when the request samples at T > 0 and `exact_scaling[k]` says the
    host divides by T after this (so scaling by T/T' gives T'). Returns the k whose temperature
    could not be applied (a greedy request asked for T' > 0, or additive penalties follow).
    `biases`: see `mask_rows`.
    """
    if not rows:
        return []
    mask_rows(logits, rows, masks, biases)
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
