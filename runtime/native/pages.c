/* Fork's memory copy: only the 4 KiB pages in which the parent differs from a fresh instance.
 *
 * A fresh instance's linear memory is zero except for the module's data image, so a parent page
 * outside the image that is all zero is already right in the child and is skipped (neither read
 * again nor written), and an image page is written only where the parent wrote it. Runs of
 * changed pages are copied with one memcpy each. /proc/self/pagemap (8 bytes a page, read 512
 * entries at a time) says which pages to read at all: a parent page the kernel has never backed
 * (neither present nor swapped) is zero without reading it, and an image page the parent never
 * wrote (unbacked, or still the image's file page: wasmtime maps the image copy-on-write) equals
 * the child's without comparing the two, so a fork costs what the parent wrote, not its memory's
 * or the image's size. This is exact when freed slots keep nothing resident (Limits.resident_bytes
 * 0, the default): a fresh instance's memory is then unbacked but for what it writes.
 *
 * Two hints bend it (any values are correct): `src_backed`, the prefix of the parent a reused
 * pooled slot kept resident (wasmtime wrote all of it at reset, so pagemap cannot tell what the
 * guest wrote there: those pages are read without asking it); `dst_backed`, the child's, where an
 * image page the parent wrote is compared with the child's before copying (reading it costs no
 * fault there; past it, the page is copied unread). The child's pages past `dst_backed` that the
 * copy writes are unbacked or the image's, so each write would fault: a run of two or more is
 * prefaulted first in one madvise(MADV_POPULATE_WRITE).
 * runtime/native/pages.py holds the Python side: the call into this. */
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>

#define AICIRT_PAGE 4096u

static int aicirt_page_is_zero(const uint8_t *p) {
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < AICIRT_PAGE / 8; i += 8) {   /* 64 bytes a round: one cache line */
        if (w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] | w[i + 7])
            return 0;
    }
    return 1;
}

/* /proc/self/pagemap, opened once (-1 where unreadable or pages are not 4 KiB: then every page is read). */
static int aicirt_pagemap_fd(void) {
    static int fd = -2;
    int cur = __atomic_load_n(&fd, __ATOMIC_ACQUIRE);
    if (cur != -2) return cur;
    int opened = sysconf(_SC_PAGESIZE) == AICIRT_PAGE ? open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC) : -1;
    int expected = -2;
    if (!__atomic_compare_exchange_n(&fd, &expected, opened, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        if (opened >= 0) close(opened);   /* another thread won */
        return expected;
    }
    return opened;
}

/* The pagemap entry of the page at `p` (all bits set where unreadable: "may hold anything").
 * `map` caches 512 entries from page `*base` on. */
static uint64_t aicirt_page_entry(const uint8_t *p, uint64_t *map, size_t *base, size_t *count) {
    int fd = aicirt_pagemap_fd();
    if (fd < 0) return UINT64_MAX;
    size_t page = (uintptr_t)p / AICIRT_PAGE;
    if (*count == 0 || page < *base || page - *base >= *count) {
        ssize_t got = pread(fd, map, 512 * sizeof *map, (off_t)(page * sizeof *map));
        *base = page;
        *count = got > 0 ? (size_t)got / sizeof *map : 0;
        if (*count == 0) return UINT64_MAX;
    }
    return map[page - *base];
}

/* Whether the page at `p` may hold data: present or swapped out (bits 63, 62 of its pagemap entry). */
static int aicirt_page_backed(const uint8_t *p, uint64_t *map, size_t *base, size_t *count) {
    return (aicirt_page_entry(p, map, base, count) >> 62) != 0;
}

/* Whether an image page of the parent may differ from the image: neither unbacked (never
 * touched: it reads as the image) nor a present file page (bit 61: still the module image's
 * copy-on-write page, never written, since a write makes it the process's own anonymous copy).
 * A swapped page (bit 62) may differ. */
static int aicirt_image_page_written(const uint8_t *p, uint64_t *map, size_t *base, size_t *count) {
    uint64_t e = aicirt_page_entry(p, map, base, count);
    if (e == UINT64_MAX) return 1;
    if ((e >> 62) & 1) return 1;                 /* swapped out */
    if (!((e >> 63) & 1)) return 0;              /* never backed */
    return !((e >> 61) & 1);                     /* present: anonymous = written */
}

/* Prefault `n` bytes at `p` for writing in one system call (MADV_POPULATE_WRITE, Linux 5.14): a
 * run of pages about to be copied into the child that are not resident there would otherwise take
 * one page fault each (zero-fill, or the image's copy-on-write). A failure (an older kernel) just
 * leaves the faults to the copy. */
static void aicirt_prefault(uint8_t *p, size_t n) {
#ifdef MADV_POPULATE_WRITE
    madvise(p, n, MADV_POPULATE_WRITE);
#else
    madvise(p, n, 23);
#endif
}

/* Copy `src` into `dst` (both `n` bytes, n a multiple of 4 KiB) where they can differ, given that
 * `dst` is a fresh instance's memory whose only nonzero bytes lie in [img_lo, img_hi), that src's
 * first `src_backed` bytes are resident (a hint: pages past it are looked up in pagemap first),
 * and that dst's first `dst_backed` bytes are resident (a hint: an image page the parent wrote is
 * compared with the child's only there, where reading the child's page costs no fault; past it
 * the page is copied, and a run of two or more copied pages is prefaulted in one call). Returns
 * the pages written. */
size_t aicirt_copy_changed(uint8_t *dst, const uint8_t *src, size_t n, size_t img_lo, size_t img_hi,
                           size_t src_backed, size_t dst_backed) {
    size_t written = 0, run = SIZE_MAX;   /* run: start of the current run of changed pages */
    uint64_t map[512];
    size_t map_base = 0, map_count = 0;
    for (size_t off = 0; off <= n; off += AICIRT_PAGE) {
        int changed = 0;
        if (off < n) {
            int in_image = off + AICIRT_PAGE > img_lo && off < img_hi;
            changed = in_image ? aicirt_image_page_written(src + off, map, &map_base, &map_count) &&
                                     (off >= dst_backed || memcmp(dst + off, src + off, AICIRT_PAGE) != 0)
                               : (off < src_backed || aicirt_page_backed(src + off, map, &map_base, &map_count))
                                 && !aicirt_page_is_zero(src + off);
        }
        if (changed && run == SIZE_MAX) {
            run = off;
        } else if (!changed && run != SIZE_MAX) {
            size_t cold = run > dst_backed ? run : dst_backed;   /* the run's part not resident in dst */
            if (off > cold && off - cold >= 2 * AICIRT_PAGE) aicirt_prefault(dst + cold, off - cold);
            memcpy(dst + run, src + run, off - run);
            written += (off - run) / AICIRT_PAGE;
            run = SIZE_MAX;
        }
    }
    return written;
}

/* [lo, hi): the pages of `p` (n bytes) that hold a nonzero byte (lo == hi == 0: none). */
void aicirt_nonzero_extent(const uint8_t *p, size_t n, size_t *lo, size_t *hi) {
    *lo = *hi = 0;
    for (size_t off = 0; off + AICIRT_PAGE <= n; off += AICIRT_PAGE) {
        if (!aicirt_page_is_zero(p + off)) {
            if (*hi == 0) *lo = off;
            *hi = off + AICIRT_PAGE;
        }
    }
}
