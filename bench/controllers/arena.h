/* The bump allocator the benchmark controllers share: cabi_realloc hands out memory from an
 * arena that post-return resets (nothing a benchmark call allocates outlives its step). */
#include <stdint.h>
#include <stddef.h>

extern unsigned char __heap_base;
static uintptr_t arena_start, arena_top;

__attribute__((export_name("cabi_realloc")))
void *cabi_realloc(void *old, size_t old_size, size_t align, size_t size) {
    (void)old; (void)old_size;
    if (!arena_start) arena_start = arena_top = (uintptr_t)&__heap_base;
    arena_top = (arena_top + align - 1) & ~(uintptr_t)(align - 1);
    uintptr_t p = arena_top;
    arena_top += size;
    size_t have = __builtin_wasm_memory_size(0) * 65536;
    if (arena_top > have && __builtin_wasm_memory_grow(0, (arena_top - have + 65535) / 65536) == (size_t)-1)
        __builtin_trap();
    return (void *)p;
}

__attribute__((export_name("cabi_post_mid-process")))
void post(void *p) { (void)p; arena_top = arena_start; }
