"""Fork's page copy: pages.c's functions through the compiled extension.

Addresses are ints, sizes bytes; a memory's size is a multiple of 4 KiB (a Wasm page is 64 KiB).
Neither function raises for a readable range; both read (and `copy_changed` writes) raw memory, so
the caller guarantees that the ranges are mapped and not in use by a running call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

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
    ffi = native.ffi
    return int(native.impl.lib.aicirt_copy_changed(ffi.cast("uint8_t *", dst), ffi.cast("uint8_t *", src), n,
                                                   *image, backed, dst_backed))


def nonzero_extent(native: "Native", addr: int, n: int) -> tuple[int, int]:
    """[lo, hi): the byte range of the 4 KiB pages at `addr` (`n` bytes) that hold a nonzero byte
    ((0, 0) if none)."""
    out = native.ffi.new("size_t[2]")
    native.impl.lib.aicirt_nonzero_extent(native.ffi.cast("uint8_t *", addr), n, out, out + 1)
    return int(out[0]), int(out[1])
