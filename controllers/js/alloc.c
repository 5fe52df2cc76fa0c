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

/* ---- The interpreter's heap (JS_NewRuntime2's functions) ------------------------------------
 * QuickJS checks its own memory limit before it allocates, and the error it then throws needs
 * memory too: at the limit, a script that filled the heap with small objects got `null` thrown
 * (QuickJS's fallback when even the InternalError cannot be made), not the documented catchable
 * `InternalError: out of memory`. So the limit is kept here instead, with a reserve: allocations
 * fail past JS_HEAP_SOFT; each failure grants JS_HEAP_GRANT more (up to JS_HEAP_LIMIT) for the
 * error and what the script's `catch` does next; once the heap is below JS_HEAP_SOFT again (the
 * script let go of memory), the reserve closes. Counted: what the interpreter holds of libc's
 * heap (malloc_usable_size), arenas included. */
#include <malloc.h>

#include "js.h"

static size_t heap_used, heap_cap = JS_HEAP_SOFT;

static int heap_allows(size_t old, size_t n) {
  if (heap_used - old + n <= heap_cap) return 1;
  size_t grant = heap_used + JS_HEAP_GRANT;   /* this allocation fails; the next ones may use the grant */
  if (grant > heap_cap) heap_cap = grant < JS_HEAP_LIMIT ? grant : JS_HEAP_LIMIT;
  return 0;
}

static void heap_took(void *p, size_t old) {
  heap_used = heap_used - old + malloc_usable_size(p);
  if (heap_used < JS_HEAP_SOFT) heap_cap = JS_HEAP_SOFT;
}

static void *heap_malloc(void *opaque, size_t n) {
  void *p = heap_allows(0, n) ? malloc(n) : 0;
  if (p) heap_took(p, 0);
  return p;
}

static void *heap_calloc(void *opaque, size_t count, size_t size) {
  if (size && count > SIZE_MAX / size) return 0;
  void *p = heap_allows(0, count * size) ? calloc(count, size) : 0;
  if (p) heap_took(p, 0);
  return p;
}

static void heap_free(void *opaque, void *p) {
  if (!p) return;
  heap_used -= malloc_usable_size(p);
  if (heap_used < JS_HEAP_SOFT) heap_cap = JS_HEAP_SOFT;
  free(p);
}

static void *heap_realloc(void *opaque, void *p, size_t n) {
  size_t old = p ? malloc_usable_size(p) : 0;
  if (!n) {   /* realloc(p, 0): QuickJS means free */
    heap_free(opaque, p);
    return 0;
  }
  if (!heap_allows(old, n)) return 0;
  void *q = realloc(p, n);
  if (q) heap_took(q, old);
  return q;
}

static size_t heap_usable(const void *p) { return malloc_usable_size((void *)p); }

const JSMallocFunctions js_heap_funcs = {heap_calloc, heap_malloc, heap_free, heap_realloc, heap_usable};
