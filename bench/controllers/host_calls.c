/* Benchmark controller for host-import cost. Its argument is "<import> <n>": each call makes
 * `n` calls of that import (none for "none"), then answers one branch allowing every token.
 * "step" instead makes the three calls a typical controller makes every step: vocab-size,
 * var-get("state") and a short log line. Freestanding, no libc. */
#include <stdint.h>
#include <stddef.h>

#define IMPORT(name) __attribute__((import_module("aici:controller/host@0.1.0"), import_name(name)))
IMPORT("vocab-size") uint32_t host_vocab_size(void);
IMPORT("eos-token") uint32_t host_eos_token(void);
IMPORT("self-seq-id") uint32_t host_self_seq_id(void);
IMPORT("capabilities") uint32_t host_capabilities(void);
IMPORT("arg") void host_arg(uint32_t *ret);
IMPORT("var-get") void host_var_get(const char *n, uint32_t nl, uint32_t *ret);
IMPORT("var-set") void host_var_set(const char *n, uint32_t nl, const void *v, uint32_t vl);
IMPORT("var-append") void host_var_append(const char *n, uint32_t nl, const void *v, uint32_t vl);
IMPORT("log") void host_log(const char *p, uint32_t n);
IMPORT("tokenize") void host_tokenize(const char *p, uint32_t n, uint32_t *ret);
IMPORT("detokenize") void host_detokenize(const uint32_t *p, uint32_t n, uint32_t *ret);

#include "arena.h"

static uint32_t mask[8192], words, ready, which, count;
static uint32_t branch[7], ret_area[2];
static const char *NAMES[] = {"none", "vocab-size", "eos-token", "self-seq-id", "capabilities", "arg", "var-get",
                              "var-set", "var-append", "log", "tokenize", "detokenize", "step"};
#define N_NAMES (sizeof NAMES / sizeof NAMES[0])

static int prefix(const char *a, uint32_t n, const char *name) {
    uint32_t i = 0;
    for (; name[i]; i++) if (i >= n || a[i] != name[i]) return 0;
    return i < n && a[i] == ' ';
}

static void setup(void) {
    uint32_t r[2];
    host_arg(r);
    const char *a = (const char *)(uintptr_t)r[0];
    for (uint32_t k = 0; k < N_NAMES; k++) {
        if (prefix(a, r[1], NAMES[k])) {
            which = k;
            for (uint32_t i = 0; NAMES[k][i]; i++) a++;
            for (a++; (uintptr_t)a < r[0] + r[1]; a++) count = count * 10 + (uint32_t)(*a - '0');
        }
    }
    uint32_t v = host_vocab_size();
    words = (v + 31) / 32;
    for (uint32_t i = 0; i < words; i++) mask[i] = ~0u;
    if (v % 32) mask[words - 1] = (1u << (v % 32)) - 1;
    branch[0] = 1; branch[1] = (uint32_t)(uintptr_t)mask; branch[2] = words;
    host_var_set("state", 5, "0123456789abcdef", 16);
    ready = 1;
}

static void call_once(uint32_t k) {
    uint32_t r[3], tok = 1;
    switch (k) {
    case 1: (void)host_vocab_size(); break;
    case 2: (void)host_eos_token(); break;
    case 3: (void)host_self_seq_id(); break;
    case 4: (void)host_capabilities(); break;
    case 5: host_arg(r); break;
    case 6: host_var_get("state", 5, r); break;
    case 7: host_var_set("x", 1, "12345678", 8); break;
    case 8: host_var_append("y", 1, "", 0); break;
    case 9: host_log("tick\n", 5); break;
    case 10: host_tokenize("hi", 2, r); break;
    case 11: host_detokenize(&tok, 1, r); break;
    }
}

__attribute__((export_name("mid-process")))
void *mid_process(uint32_t bt, uint32_t *t, uint32_t nt, uint32_t some, uint32_t s, uint32_t *g, uint32_t ng) {
    (void)bt; (void)t; (void)nt; (void)some; (void)s; (void)g; (void)ng;
    if (!ready) setup();
    else if (which == 12) { uint32_t r[3]; (void)host_vocab_size(); host_var_get("state", 5, r); host_log("step\n", 5); }
    else for (uint32_t i = 0; i < count; i++) call_once(which);
    ret_area[0] = (uint32_t)(uintptr_t)branch; ret_area[1] = 1;
    return ret_area;
}
