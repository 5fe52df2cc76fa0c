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


def copy_changed(native: "Native", dst: int, src: int, n: int, image: tuple[int, int], backed: int = 0,
                 dst_backed: int = 0) -> int:
    """Copy the `n` bytes at `src` to `dst` where they can differ, `dst` being a fresh instance's
    memory whose only nonzero bytes lie in `image` ([lo, hi) in bytes): the pages nonzero in
    `src`, and the pages of `image` that `src` wrote (pagemap: neither unbacked nor still the
    image's copy-on-write page), those in dst's first `dst_backed` bytes only where the two
    differ. `backed` / `dst_backed`: bytes at the start of `src` / `dst` known to be resident
    (hints: any values are correct; `backed` is read without asking pagemap, and past
    `dst_backed` an image page `src` wrote is copied without reading the child's, which would
    fault it in). Returns the 4 KiB pages written."""
    if native.mode == "compiled":
        ffi = native.ffi
        return int(native.impl.lib.aicirt_copy_changed(ffi.cast("uint8_t *", dst), ffi.cast("uint8_t *", src), n,
                                                       *image, backed, dst_backed))
    return _copy_changed_numpy(dst, src, n, image, backed, dst_backed)


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


def _entries(addr: int, pages: int) -> np.ndarray | None:
    """The pagemap entries of `pages` pages from `addr` (None where /proc/self/pagemap cannot be
    read or pages are not 4 KiB)."""
    global _pagemap_fd
    raw = b""
    try:
        if _pagemap_fd is None:
            _pagemap_fd = os.open("/proc/self/pagemap", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        raw = os.pread(_pagemap_fd, 8 * pages, 8 * (addr // PAGE))
    except OSError:
        pass
    if len(raw) != 8 * pages or os.sysconf("SC_PAGESIZE") != PAGE:
        return None
    return np.frombuffer(raw, dtype=np.uint64)


def _backed(addr: int, pages: int) -> np.ndarray:
    """pages.c's aicirt_page_backed for `pages` pages from `addr`: present or swapped out (all
    True where pagemap cannot be read)."""
    e = _entries(addr, pages)
    return np.ones(pages, dtype=bool) if e is None else (e >> np.uint64(62)) != 0


def _image_written(addr: int, pages: int) -> np.ndarray:
    """pages.c's aicirt_image_page_written for `pages` pages from `addr`: swapped, or present and
    anonymous (not the image's file page); all True where pagemap cannot be read."""
    e = _entries(addr, pages)
    if e is None:
        return np.ones(pages, dtype=bool)
    swapped, present, file = ((e >> np.uint64(b)) & np.uint64(1) for b in (62, 63, 61))
    return (swapped | (present & (file ^ np.uint64(1)))) != 0


def _copy_changed_numpy(dst: int, src: int, n: int, image: tuple[int, int], backed: int = 0,
                        dst_backed: int = 0) -> int:
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
    if hi > lo:   # as pages.c: the image pages src wrote; compared with dst's only where dst is resident
        written = _image_written(src + lo * PAGE, hi - lo)
        cut = min(max(dst_backed // PAGE, lo), hi)
        changed[lo:cut] = written[:cut - lo] & (s[lo:cut] != d[lo:cut]).any(axis=1)
        changed[cut:hi] = written[cut - lo:]
    idx = np.flatnonzero(changed)
    if len(idx):
        breaks = np.flatnonzero(np.diff(idx) != 1)
        for a, b in zip(np.r_[idx[0], idx[breaks + 1]], np.r_[idx[breaks], idx[-1]]):
            d[a:b + 1] = s[a:b + 1]
    return len(idx)
