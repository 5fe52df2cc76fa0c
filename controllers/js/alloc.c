/* The SDK's allocator entry points over wasi-libc's malloc (the js controller links wasi-libc for
 * QuickJS, so the SDK's own heap, aici_alloc.c, is left out: one heap in the module, not two).
 *
 * Same contract as aici_alloc.c: aici_malloc & co. never return NULL (out of memory logs and
 * ends the sequence), aici_free ignores NULL and pointers below the heap (the canonical ABI's
 * empty lists point at 8, and the SDK frees the host's argument lists unconditionally). */
#include <stdint.h>
#include <stdlib.h>

#include "aici.h"

extern unsigned char __heap_base;

__attribute__((noreturn)) static void out_of_memory(size_t n) {
  aici_fail("js: out of guest memory allocating %zu bytes", n);
}

void *aici_malloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) out_of_memory(n);
  return p;
}

void *aici_calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) out_of_memory(n * size);
  return p;
}

void *aici_realloc(void *p, size_t n) {
  if ((uintptr_t)p < (uintptr_t)&__heap_base) p = 0;
  void *q = realloc(p, n ? n : 1);
  if (!q) out_of_memory(n);
  return q;
}

void aici_free(void *p) {
  if ((uintptr_t)p >= (uintptr_t)&__heap_base) free(p);
}
