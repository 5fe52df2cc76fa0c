/* A test controller driven by a script in its argument (built by tests/scripted.py).
 *
 * Every call appends what it received to variable "trace" (u32 words: seq-id, backtrack,
 * n_tokens, tokens..., sampled_is_some, sampled, n_group, group...) and returns the script's
 * step for this call (the last step repeats). Steps can also misbehave on purpose: trap, loop
 * forever, grow memory, overflow the stack, return bad pointers. Freestanding: no libc. */
#include <stdint.h>
#include <stddef.h>

#define IMPORT(name) __attribute__((import_module("aici:controller/host@0.1.0"), import_name(name)))
IMPORT("arg") void host_arg(uint32_t *ret);
IMPORT("var-append") void host_var_append(const char *n, uint32_t nl, const void *v, uint32_t vl);
IMPORT("var-set") void host_var_set(const char *n, uint32_t nl, const void *v, uint32_t vl);
IMPORT("var-get") void host_var_get(const char *n, uint32_t nl, uint32_t *ret);
IMPORT("log") void host_log(const char *p, uint32_t n);
IMPORT("self-seq-id") uint32_t host_self_seq_id(void);
IMPORT("vocab-size") uint32_t host_vocab_size(void);
IMPORT("eos-token") uint32_t host_eos_token(void);
IMPORT("tokenize") void host_tokenize(const char *p, uint32_t n, uint32_t *ret);
IMPORT("detokenize") void host_detokenize(const uint32_t *p, uint32_t n, uint32_t *ret);
IMPORT("token-trie") void host_token_trie(uint32_t *ret);
IMPORT("capabilities") uint32_t host_capabilities(void);

void *memcpy(void *d, const void *s, size_t n) { uint8_t *a = d; const uint8_t *b = s; while (n--) *a++ = *b++; return d; }
void *memset(void *d, int c, size_t n) { uint8_t *a = d; while (n--) *a++ = (uint8_t)c; return d; }

extern unsigned char __heap_base;
static uintptr_t heap_top;
__attribute__((export_name("cabi_realloc")))
void *cabi_realloc(void *old, size_t old_size, size_t align, size_t new_size) {
    if (!heap_top) heap_top = (uintptr_t)&__heap_base;
    heap_top = (heap_top + align - 1) & ~(uintptr_t)(align - 1);
    uintptr_t p = heap_top;
    heap_top += new_size;
    size_t have = __builtin_wasm_memory_size(0) * 65536;
    if (heap_top > have) {
        if (__builtin_wasm_memory_grow(0, (heap_top - have + 65535) / 65536) == (size_t)-1) __builtin_trap();
    }
    if (old && old_size) memcpy((void *)p, old, old_size < new_size ? old_size : new_size);
    return (void *)p;
}

static uint32_t *script, script_len, calls, pos;
static uint32_t my_fork_index;
static uint32_t out[64 * 1024];
static uint32_t out_len;

static uint32_t next(void) { return pos < script_len ? script[pos++] : 0; }

enum { OP_RESULT = 1, OP_TRAP = 2, OP_LOOP = 3, OP_GROW = 4, OP_RECURSE = 5, OP_BAD_RESULT_PTR = 6,
       OP_SWITCH = 7, OP_VAR_SET = 8, OP_LOG = 9, OP_WAIT_VAR = 10, OP_HOST_INFO = 11, OP_BAD_HOST_PTR = 12,
       OP_SPIN = 13, OP_BAD_TOKENIZE_PTR = 14 };

static uint32_t recurse(uint32_t n) { volatile uint32_t pad[64]; pad[0] = n; return n ? recurse(n - 1) + pad[0] : 0; }

/* Branch list in the canonical ABI layout, built in `out`. */
typedef struct { uint8_t mask_tag; uint8_t p0[3]; uint32_t mask_ptr, mask_len; uint8_t temp_tag; uint8_t p1[3];
                 float temp; uint32_t splices_ptr, splices_len; } branch_t;
typedef struct { uint32_t when_ptr, when_len, backtrack, ff_ptr, ff_len; } splice_t;
static uint32_t ret_area[2];

static uint32_t *alloc_words(uint32_t n) { uint32_t *p = out + out_len; out_len += n; return p; }

/* Encoding of a result: n_branches, then per branch:
 *   mask_kind (0 none | 1 allow-list: n, ids... | 2 raw words: n, words...), temp_kind (0|1), temp_bits,
 *   n_splices, per splice: n_when, ids..., backtrack, n_ff, ids... */
static void *build_result(void) {
    uint32_t nb = next();
    branch_t *br = (branch_t *)alloc_words(nb * 7);
    uint32_t words = (host_vocab_size() + 31) / 32;
    for (uint32_t b = 0; b < nb; b++) {
        uint32_t kind = next();
        br[b].mask_tag = kind != 0;
        if (kind == 1) {
            uint32_t *m = alloc_words(words);
            for (uint32_t i = 0; i < words; i++) m[i] = 0;
            uint32_t n = next();
            for (uint32_t i = 0; i < n; i++) { uint32_t t = next(); m[t / 32] |= 1u << (t % 32); }
            br[b].mask_ptr = (uint32_t)(uintptr_t)m; br[b].mask_len = words;
        } else if (kind == 2) {
            uint32_t n = next();
            uint32_t *m = alloc_words(n);
            for (uint32_t i = 0; i < n; i++) m[i] = next();
            br[b].mask_ptr = (uint32_t)(uintptr_t)m; br[b].mask_len = n;
        }
        br[b].temp_tag = next() != 0;
        uint32_t bits = next();
        memcpy(&br[b].temp, &bits, 4);
        uint32_t ns = next();
        splice_t *sp = (splice_t *)alloc_words(ns * 5);
        for (uint32_t s = 0; s < ns; s++) {
            uint32_t n = next(); uint32_t *w = alloc_words(n);
            for (uint32_t i = 0; i < n; i++) w[i] = next();
            sp[s].when_ptr = (uint32_t)(uintptr_t)w; sp[s].when_len = n;
            sp[s].backtrack = next();
            n = next(); uint32_t *f = alloc_words(n);
            for (uint32_t i = 0; i < n; i++) f[i] = next();
            sp[s].ff_ptr = (uint32_t)(uintptr_t)f; sp[s].ff_len = n;
        }
        br[b].splices_ptr = (uint32_t)(uintptr_t)sp; br[b].splices_len = ns;
    }
    ret_area[0] = (uint32_t)(uintptr_t)br; ret_area[1] = nb;
    return ret_area;
}

static uint32_t *seek_step(uint32_t k) {  /* steps: n_steps, then per step: length, words */
    pos = 0;
    uint32_t n = next();
    if (k >= n) k = n - 1;
    for (uint32_t i = 0; i < k; i++) { uint32_t len = next(); pos += len; }
    next();
    return 0;
}

static void *run_op(void) {
    uint32_t op = next();
    switch (op) {
    case OP_RESULT: return build_result();
    case OP_TRAP: __builtin_trap();
    case OP_LOOP: for (volatile uint32_t i = 0;; i++) {}
    case OP_GROW: __builtin_wasm_memory_grow(0, next()) == (size_t)-1 ? __builtin_trap() : (void)0; return run_op();
    case OP_RECURSE: recurse(next()); return run_op();
    case OP_BAD_RESULT_PTR: ret_area[0] = 0xFFFFFFF0u; ret_area[1] = 1; return ret_area;
    case OP_SWITCH: {
        uint32_t n = next(), pick = my_fork_index < n ? my_fork_index : n - 1;
        for (uint32_t i = 0; i < pick; i++) { uint32_t len = next(); pos += len; }
        next();
        return run_op();
    }
    case OP_VAR_SET: {
        uint32_t nl = next(); const char *name = (const char *)(script + pos); pos += (nl + 3) / 4;
        uint32_t vl = next(); const char *val = (const char *)(script + pos); pos += (vl + 3) / 4;
        host_var_set(name, nl, val, vl);
        return run_op();
    }
    case OP_LOG: {
        uint32_t nl = next(); const char *msg = (const char *)(script + pos); pos += (nl + 3) / 4;
        host_log(msg, nl);
        return run_op();
    }
    case OP_WAIT_VAR: {  /* no-op until the variable exists, then run the rest */
        uint32_t nl = next(); const char *name = (const char *)(script + pos); pos += (nl + 3) / 4;
        uint32_t r[3];
        host_var_get(name, nl, r);
        if (!(r[0] & 0xff)) {
            calls--;  /* retry this step next call */
            branch_t *br = (branch_t *)alloc_words(7);
            splice_t *sp = (splice_t *)alloc_words(5);
            memset(br, 0, sizeof *br); memset(sp, 0, sizeof *sp);
            br->splices_ptr = (uint32_t)(uintptr_t)sp; br->splices_len = 1;
            ret_area[0] = (uint32_t)(uintptr_t)br; ret_area[1] = 1;
            return ret_area;
        }
        return run_op();
    }
    case OP_HOST_INFO: {  /* record what every simple host import returns into variable "info" */
        uint32_t info[8], r[2];
        info[0] = host_vocab_size(); info[1] = host_eos_token(); info[2] = host_capabilities();
        info[3] = host_self_seq_id();
        host_tokenize("hi", 2, r); info[4] = r[1]; info[5] = r[1] ? ((uint32_t *)(uintptr_t)r[0])[0] : 0;
        host_detokenize((uint32_t *)(uintptr_t)r[0], r[1], r); info[6] = r[1];
        host_token_trie(r); info[7] = r[1];
        host_var_set("info", 4, info, sizeof info);
        return run_op();
    }
    case OP_BAD_HOST_PTR: host_log((const char *)0x7FFFFFF0, 100); return run_op();
    case OP_BAD_TOKENIZE_PTR: { uint32_t r[2]; host_tokenize((const char *)0x7FFFFFF0, 100, r); return run_op(); }
    case OP_SPIN: { uint32_t n = next(); for (volatile uint32_t i = 0; i < n; i++) {} return run_op(); }
    default: __builtin_trap();
    }
}

__attribute__((export_name("mid-process")))
void *mid_process(uint32_t backtrack, uint32_t *tokens, uint32_t n_tokens, uint32_t sampled_is_some,
                  uint32_t sampled, uint32_t *group, uint32_t n_group) {
    if (!script) {
        uint32_t r[2];
        host_arg(r);
        script = (uint32_t *)(uintptr_t)r[0]; script_len = r[1] / 4;
    }
    out_len = 0;
    uint32_t me = host_self_seq_id();
    if (n_group) for (uint32_t i = 0; i < n_group; i++) if (group[i] == me) my_fork_index = i;
    uint32_t *t = alloc_words(6 + n_tokens + n_group);
    uint32_t k = 0;
    t[k++] = me; t[k++] = backtrack; t[k++] = n_tokens;
    for (uint32_t i = 0; i < n_tokens; i++) t[k++] = tokens[i];
    t[k++] = sampled_is_some; t[k++] = sampled; t[k++] = n_group;
    for (uint32_t i = 0; i < n_group; i++) t[k++] = group[i];
    host_var_append("trace", 5, t, k * 4);
    out_len = 0;
    seek_step(calls++);
    return run_op();
}

__attribute__((export_name("cabi_post_mid-process")))
void post(void *p) { (void)p; }
