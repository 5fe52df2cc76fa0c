"""Fork's page copy, for both hot paths: pages.c's functions through the compiled extension, and
the same with numpy for the pure-Python fallback (no C compiler).

Addresses are ints, sizes bytes; a memory's size is a multiple of 4 KiB (a Wasm page is 64 KiB).
Neither function raises for a readable range; both read (and `copy_changed` writes) raw memory, so
the caller guarantees that the ranges are mapped and not in use by a running call.
"""
from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from . import Native

PAGE = 4096   # pages.c's AICIRT_PAGE


def copy_changed(native: "Native", dst: int, src: int, n: int, image: tuple[int, int], backed: int = 0) -> int:
    """Copy the `n` bytes at `src` to `dst` where they can differ, `dst` being a fresh instance's
    memory whose only nonzero bytes lie in `image` ([lo, hi) in bytes): the pages nonzero in
    `src`, and the pages of `image` where the two differ. `backed`: bytes at the start of `src`
    known to be resident (read without asking pagemap; a hint, any value is correct). Returns
    the 4 KiB pages written."""
    if native.mode == "compiled":
        ffi = native.ffi
        return int(native.impl.lib.aicirt_copy_changed(ffi.cast("uint8_t *", dst), ffi.cast("uint8_t *", src), n,
                                                       *image, backed))
    return _copy_changed_numpy(dst, src, n, image, backed)


def nonzero_extent(native: "Native", addr: int, n: int) -> tuple[int, int]:
    """[lo, hi): the byte range of the 4 KiB pages at `addr` (`n` bytes) that hold a nonzero byte
    ((0, 0) if none)."""
    if native.mode == "compiled":
        out = native.ffi.new("size_t[2]")
        native.impl.lib.aicirt_nonzero_extent(native.ffi.cast("uint8_t *", addr), n, out, out + 1)
        return int(out[0]), int(out[1])
    idx = np.flatnonzero(_pages(addr, n).any(axis=1)) if n else np.zeros(0, dtype=np.intp)
    return (int(idx[0]) * PAGE, (int(idx[-1]) + 1) * PAGE) if len(idx) else (0, 0)


def _pages(addr: int, n: int) -> np.ndarray:
    """The `n` bytes at `addr` as a (pages, 512) uint64 view (n a multiple of 4 KiB)."""
    return np.ctypeslib.as_array((ctypes.c_uint64 * (n // 8)).from_address(addr)).reshape(n // PAGE, PAGE // 8)


_pagemap_fd: int | None = None


def _backed(addr: int, pages: int) -> np.ndarray:
    """pages.c's aicirt_page_backed for `pages` pages from `addr`: present or swapped out (all
    True where /proc/self/pagemap cannot be read or pages are not 4 KiB)."""
    global _pagemap_fd
    raw = b""
    try:
        if _pagemap_fd is None:
            _pagemap_fd = os.open("/proc/self/pagemap", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        raw = os.pread(_pagemap_fd, 8 * pages, 8 * (addr // PAGE))
    except OSError:
        pass
    if len(raw) != 8 * pages or os.sysconf("SC_PAGESIZE") != PAGE:
        return np.ones(pages, dtype=bool)
    return (np.frombuffer(raw, dtype=np.uint64) >> np.uint64(62)) != 0


def _copy_changed_numpy(dst: int, src: int, n: int, image: tuple[int, int], backed: int = 0) -> int:
    if n == 0:
        return 0
    s, d = _pages(src, n), _pages(dst, n)
    known = min(n, backed) // PAGE
    changed = np.ones(n // PAGE, dtype=bool)
    if known < n // PAGE:
        changed[known:] = _backed(src + known * PAGE, n // PAGE - known)
    if changed.all():
        changed = s.max(axis=1) != 0          # a reduction, no temporary of the memory's size
    elif changed.any():
        changed[changed] = s[changed].max(axis=1) != 0
    lo, hi = image[0] // PAGE, -(-image[1] // PAGE)
    if hi > lo:
        changed[lo:hi] = (s[lo:hi] != d[lo:hi]).any(axis=1)
    idx = np.flatnonzero(changed)
    if len(idx):
        breaks = np.flatnonzero(np.diff(idx) != 1)
        for a, b in zip(np.r_[idx[0], idx[breaks + 1]], np.r_[idx[breaks], idx[-1]]):
            d[a:b + 1] = s[a:b + 1]
    return len(idx)
