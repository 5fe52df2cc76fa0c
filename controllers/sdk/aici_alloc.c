/* The SDK's heap: a size-class allocator on top of memory.grow, plus the few libc functions the
 * compiler and the SDK need. Controllers are libc-free (no WASI imports), so this is the libc.
 *
 * Why size classes: controllers allocate few, long-lived blocks (trie, DFA tables, masks) and
 * many small per-step ones; power-of-two classes with free lists are fast and never fragment
 * badly. Blocks over 64 KiB are rounded to 64 KiB and kept on one first-fit list. Memory is
 * never returned to the host (linear memory cannot shrink).
 */
#include "aici.h"

#define MAGIC 0xA1C1B10Cu
#define SMALL_MAX_SHIFT 16            /* classes 2^4 .. 2^16 */
#define LARGE_UNIT 65536u

typedef struct header {
  uint32_t magic;
  uint32_t cap;                       /* usable bytes after the header */
} header_t;

typedef struct free_block {
  struct free_block *next;
} free_block_t;

extern unsigned char __heap_base;
static uintptr_t heap_top, heap_end;
static free_block_t *small_free[SMALL_MAX_SHIFT + 1];
static free_block_t *large_free;

/* Out of memory is a trap, never NULL: C code rarely checks, and a write through NULL does not
 * fault in Wasm (address 0 is ordinary linear memory), so a NULL would silently corrupt the heap. */
__attribute__((noreturn)) static void out_of_memory(size_t n) {
  aici_fail("aici: out of guest memory allocating %zu bytes (heap at %zu bytes)", n, (size_t)heap_top);
}

static void *bump(size_t total) {
  if (!heap_top) {
    heap_top = ((uintptr_t)&__heap_base + 15) & ~(uintptr_t)15;
    heap_end = (uintptr_t)__builtin_wasm_memory_size(0) * 65536u;
  }
  if (total > (size_t)0x7fffffff) out_of_memory(total);
  if (heap_top + total > heap_end) {
    size_t need = heap_top + total - heap_end;
    size_t pages = (need + 65535) / 65536;
    if (__builtin_wasm_memory_grow(0, pages) == (size_t)-1) out_of_memory(total);
    heap_end += pages * 65536;
  }
  void *p = (void *)heap_top;
  heap_top += total;
  return p;
}

static unsigned class_of(size_t n) {  /* smallest k >= 4 with 2^k >= n */
  unsigned k = 4;
  while (((size_t)1 << k) < n) k++;
  return k;
}

void *aici_malloc(size_t n) {
  if (n == 0) n = 1;
  header_t *h;
  if (n <= ((size_t)1 << SMALL_MAX_SHIFT)) {
    unsigned k = class_of(n);
    free_block_t *f = small_free[k];
    if (f) {
      small_free[k] = f->next;
      h = (header_t *)f - 1;
    } else {
      /* 16-byte blocks get 8 bytes of header: payload stays 8-aligned */
      h = bump(sizeof(header_t) + ((size_t)1 << k));
      h->cap = 1u << k;
    }
  } else {
    if (n > 0x7fff0000u) out_of_memory(n);
    uint32_t cap = (uint32_t)((n + LARGE_UNIT - 1) / LARGE_UNIT * LARGE_UNIT);
    free_block_t **pp = &large_free, **best = 0;
    for (; *pp; pp = &(*pp)->next) {
      uint32_t c = ((header_t *)*pp - 1)->cap;
      if (c >= cap && (!best || c < ((header_t *)*best - 1)->cap)) best = pp;
    }
    if (best) {
      free_block_t *f = *best;
      *best = f->next;
      h = (header_t *)f - 1;
    } else {
      h = bump(sizeof(header_t) + cap);
      h->cap = cap;
    }
  }
  h->magic = MAGIC;
  return h + 1;
}

static header_t *owned(void *p) {
  uintptr_t a = (uintptr_t)p;
  if (!p || (a & 7) || a < (uintptr_t)&__heap_base + sizeof(header_t) || a >= heap_top) return 0;
  header_t *h = (header_t *)p - 1;
  return h->magic == MAGIC ? h : 0;
}

void aici_free(void *p) {
  header_t *h = owned(p);
  if (!h) return;
  h->magic = 0;
  free_block_t *f = p;
  if (h->cap <= (1u << SMALL_MAX_SHIFT)) {
    unsigned k = class_of(h->cap);
    f->next = small_free[k];
    small_free[k] = f;
  } else {
    f->next = large_free;
    large_free = f;
  }
}

void *aici_calloc(size_t n, size_t size) {
  if (size && n > (size_t)-1 / size) out_of_memory((size_t)-1);
  void *p = aici_malloc(n * size);
  __builtin_memset(p, 0, n * size);
  return p;
}

void *aici_realloc(void *p, size_t n) {
  header_t *h = owned(p);
  if (!h) return aici_malloc(n);
  if (n <= h->cap) return p;
  void *q = aici_malloc(n);
  __builtin_memcpy(q, p, h->cap);
  aici_free(p);
  return q;
}

/* ---- the libc subset (clang emits calls to the first four) ---------------------------------
 * Built with bulk memory: __builtin_memcpy/memset/memmove lower to memory.copy/memory.fill,
 * not to a call back into these functions. */
void *memcpy(void *d, const void *s, size_t n) { return __builtin_memcpy(d, s, n); }
void *memmove(void *d, const void *s, size_t n) { return __builtin_memmove(d, s, n); }
void *memset(void *d, int c, size_t n) { return __builtin_memset(d, c, n); }

__attribute__((no_builtin)) int memcmp(const void *a, const void *b, size_t n) {
  const unsigned char *x = a, *y = b;
  for (size_t i = 0; i < n; i++)
    if (x[i] != y[i]) return x[i] - y[i];
  return 0;
}

__attribute__((no_builtin)) size_t strlen(const char *s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}

__attribute__((no_builtin)) int strcmp(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return (unsigned char)*a - (unsigned char)*b;
}

/* So that C code written against <stdlib.h> links too. */
void *malloc(size_t n) { return aici_malloc(n); }
void *calloc(size_t n, size_t s) { return aici_calloc(n, s); }
void *realloc(void *p, size_t n) { return aici_realloc(p, n); }
void free(void *p) { aici_free(p); }
