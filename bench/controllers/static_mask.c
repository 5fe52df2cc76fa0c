/* Benchmark controller: answers every call with one branch whose mask allows every token, after
 * `work` rounds of busy work (the argument, a u32; 0 = almost nothing). Freestanding, no libc. */
#include <stdint.h>
#include <stddef.h>

#define IMPORT(name) __attribute__((import_module("aici:controller/host@0.1.0"), import_name(name)))
IMPORT("vocab-size") uint32_t host_vocab_size(void);
IMPORT("arg") void host_arg(uint32_t *ret);

#include "arena.h"

static uint32_t mask[8192], words, work, ready;
static uint32_t branch[7], ret_area[2];

__attribute__((export_name("mid-process")))
void *mid_process(uint32_t bt, uint32_t *t, uint32_t nt, uint32_t some, uint32_t s, uint32_t *g, uint32_t ng) {
    (void)bt; (void)t; (void)nt; (void)some; (void)s; (void)g; (void)ng;
    if (!ready) {
        uint32_t r[2];
        host_arg(r);
        work = r[1] >= 4 ? *(uint32_t *)(uintptr_t)r[0] : 0;
        uint32_t v = host_vocab_size();
        words = (v + 31) / 32;
        for (uint32_t i = 0; i < words; i++) mask[i] = ~0u;
        if (v % 32) mask[words - 1] = (1u << (v % 32)) - 1;
        branch[0] = 1; branch[1] = (uint32_t)(uintptr_t)mask; branch[2] = words;
        ready = 1;
    }
    volatile uint32_t acc = 0;
    for (uint32_t i = 0; i < work; i++) acc += mask[i % words] ^ i;
    ret_area[0] = (uint32_t)(uintptr_t)branch; ret_area[1] = 1;
    return ret_area;
}
