/* The pushdown matcher over the schema's machines (see matcher.h).
 *
 * A configuration is (machine, DFA state, parent frame); frames are hash-consed, so a whole
 * stack is one id and configurations compare as three words. On a byte, a configuration may
 * (a) step within its machine, (b) call: its state has CALL_BYTE, hi, lo transitions, so the
 * caller's state after them is pushed and the callee starts on the byte, (c) return: its state
 * accepts, so the caller resumes on the byte. Calls to a machine that ends right after the call
 * reuse the caller's parent (tail calls), so chains of calls do not grow the stack.
 */
#include "matcher_int.h"
uint32_t mt_hash3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t h = 2166136261u;
  h = (h ^ a) * 16777619u, h = (h ^ b) * 16777619u, h = (h ^ c) * 16777619u;
  return h ^ (h >> 15);
}

static void grow(matcher_t *M, uint32_t n) {
  if (n <= M->cap) return;
  uint32_t cap = M->cap ? M->cap : 16;
  while (cap < n) cap *= 2;
  M->re = aici_realloc(M->re, cap * sizeof(void *));
  M->info = aici_realloc(M->info, cap * sizeof(void *));
  M->info_cap = aici_realloc(M->info_cap, cap * 4);
  M->reps = aici_realloc(M->reps, cap * sizeof(void *));
  M->lc = aici_realloc(M->lc, cap * sizeof(void *));
  for (uint32_t i = M->cap; i < cap; i++) M->re[i] = 0, M->info[i] = 0, M->info_cap[i] = 0, M->reps[i] = 0, M->lc[i] = 0;
  M->cap = cap;
}

#define COMPILE_MIB 48u                /* guest memory the compiled machines may reach (MiB) */
#define ID_MAX 65536u                  /* a call names its machine in 16 bits */
#define DYN_MAX 8192u                  /* dynamic machines a sequence makes at most */

static uint32_t reserve(void *ctx) {
  matcher_t *M = ctx;
  if (M->n >= ID_MAX) return 0;
  grow(M, M->n + 1);
  return M->n++;
}

static bool told_dyn;

/* Machine k, made now if it is a dynamic one not made yet; false when it cannot be. */
static bool ensure(matcher_t *M, uint32_t k) {
  if (M->re[k]) return true;
  if (M->n_dyn >= DYN_MAX) {
    if (!told_dyn) told_dyn = true, aici_logs("json: over 8192 key sets (any_order); the others are not offered\n");
    return false;
  }
  aici_buf_t t = {0};
  if (!M->dyn_write || !M->dyn_write(M->dyn, k, reserve, M, &t)) { aici_free(t.p); return false; }
  aici_regex_t *re = aici_regex_compile(t.p, t.n, 0);
  aici_free(t.p);
  if (!re) return false;
  aici_regex_cache_limit(re, 0);
  aici_regex_use_slices(re, false);
  M->re[k] = re, M->n_dyn++;
  return true;
}

matcher_t *matcher_new(const compiled_t *src, char **err) {
  matcher_t *M = aici_calloc(1, sizeof *M);
  grow(M, src->n);
  M->n = src->n, M->dyn = src->dyn, M->dyn_write = src->dyn_write;
  for (uint32_t i = 0; i < src->n; i++) {
    char *e = 0;
    if (!src->m[i].text) continue;     /* dynamic: made on first entry */
    M->re[i] = aici_regex_compile(src->m[i].text, src->m[i].len, &e);
    if (!M->re[i]) {
      aici_buf_t m = {0};
      aici_buf_puts(&m, "unsupported: schema at # (a part compiles to a regex the SDK rejects: ");
      aici_buf_puts(&m, e ? e : "?");
      aici_buf_putc(&m, ')');
      *err = m.p;
      return 0;
    }
    aici_regex_cache_limit(M->re[i], 0);   /* masks are cached here, per configuration set */
    aici_regex_use_slices(M->re[i], false); /* the string slice below serves the free strings */
    if (src->m[i].counted && !(M->lc[i] = lencount_new(M->re[i], src->m[i].lo, src->m[i].hi, err))) return 0;
    if (__builtin_wasm_memory_size(0) / 16 > COMPILE_MIB) {   /* a clear error, before the host's limit traps */
      static const char msg[] = "unsupported: schema at # (its machines take over 48 MiB of guest memory)";
      *err = aici_malloc(sizeof msg);
      __builtin_memcpy(*err, msg, sizeof msg);
      return 0;
    }
  }
  /* machines that admit no value: none of them at the root is an error; calls into the others are
   * taken out of the texts (and skipped by dynamic machines, made later) */
  M->dead = aici_calloc(src->n + 1, 1);
  bool *prod = aici_malloc(src->n + 1);
  machines_productive(M->re, M->lc, src->n, prod);
  if (src->n && !prod[0]) {
    static const char msg[] = "the schema admits no document";
    *err = aici_malloc(sizeof msg);
    __builtin_memcpy(*err, msg, sizeof msg);
    aici_free(prod);
    return 0;
  }
  bool any_dead = false;
  for (uint32_t i = 0; i < src->n; i++) any_dead |= !prod[i];
  for (uint32_t i = 0; i < src->n && any_dead; i++) {   /* (none dead, the usual case: no text changes) */
    M->dead[i] = !prod[i];
    uint32_t len = 0;
    char *t = src->m[i].text && !src->m[i].counted ? text_without_dead_calls(src->m[i].text, src->m[i].len, prod, src->n, &len) : 0;
    if (!t) continue;
    aici_regex_t *re = aici_regex_compile(t, len, 0);
    aici_free(t);
    if (!re) continue;                 /* (it compiled with the calls: keep that one) */
    aici_regex_cache_limit(re, 0);
    aici_regex_use_slices(re, false);
    M->re[i] = re;                     /* (the first one's memory is not reclaimed: the SDK has no free) */
    if (__builtin_wasm_memory_size(0) / 16 > COMPILE_MIB) {
      static const char msg[] = "unsupported: schema at # (its machines take over 48 MiB of guest memory)";
      *err = aici_malloc(sizeof msg);
      __builtin_memcpy(*err, msg, sizeof msg);
      aici_free(prod);
      return 0;
    }
  }
  M->n_static = src->n;
  aici_free(prod);
  M->cap_fr = 64;
  M->fr = aici_malloc(M->cap_fr * sizeof(frame_t));
  M->n_fr = 1;                         /* frame 0: the empty stack */
  M->fr[0] = (frame_t){0, 0, 0, 0};
  M->fr_ht_cap = 256;
  M->fr_ht = aici_calloc(M->fr_ht_cap, 4);
  M->calls_ht_cap = 256;
  M->calls_ht = aici_calloc(M->calls_ht_cap, sizeof(calls_ent_t));
  return M;
}

uint32_t matcher_machines(const matcher_t *M) { return M->n; }

uint32_t matcher_dfa_states(const matcher_t *M) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < M->n; i++)
    if (M->re[i]) n += aici_regex_num_states(M->re[i]);
  return n;
}

void matcher_reference(matcher_t *M, bool on) { M->reference = on; }

static uint32_t frame(matcher_t *M, uint32_t m, uint32_t s, uint32_t parent) {
  uint32_t h = mt_hash3(m, s, parent);
  for (uint32_t k = h & (M->fr_ht_cap - 1);; k = (k + 1) & (M->fr_ht_cap - 1)) {
    uint32_t f = M->fr_ht[k];
    if (!f) break;
    if (M->fr[f].m == m && M->fr[f].s == s && M->fr[f].parent == parent) return f;
  }
  if (M->n_fr == M->cap_fr) M->fr = aici_realloc(M->fr, (M->cap_fr *= 2) * sizeof(frame_t));
  uint32_t f = M->n_fr++;
  M->fr[f] = (frame_t){m, s, parent, M->fr[parent].depth + 1};
  if (2 * M->n_fr > M->fr_ht_cap) {    /* rehash at half full */
    aici_free(M->fr_ht);
    M->fr_ht_cap *= 2;
    M->fr_ht = aici_calloc(M->fr_ht_cap, 4);
    for (uint32_t i = 1; i < M->n_fr; i++) {
      uint32_t k = mt_hash3(M->fr[i].m, M->fr[i].s, M->fr[i].parent) & (M->fr_ht_cap - 1);
      while (M->fr_ht[k]) k = (k + 1) & (M->fr_ht_cap - 1);
      M->fr_ht[k] = i;
    }
  } else {
    uint32_t k = h & (M->fr_ht_cap - 1);
    while (M->fr_ht[k]) k = (k + 1) & (M->fr_ht_cap - 1);
    M->fr_ht[k] = f;
  }
  return f;
}

uint16_t mt_state_info(matcher_t *M, uint32_t m, uint32_t s) {
  if (s >= M->info_cap[m]) {
    uint32_t cap = M->info_cap[m] ? M->info_cap[m] : 64;
    while (cap <= s) cap *= 2;
    M->info[m] = aici_realloc(M->info[m], cap * sizeof(uint16_t));
    __builtin_memset(M->info[m] + M->info_cap[m], 0, (cap - M->info_cap[m]) * sizeof(uint16_t));
    M->info_cap[m] = cap;
  }
  uint16_t f = M->info[m][s];
  if (f) return f;
  aici_regex_t *re = M->re[m];
  f = ST_KNOWN;
  if (aici_regex_step(re, s, CALL_BYTE)) f |= ST_CALLS;
  if (aici_regex_accepting(re, s)) {
    f |= ST_ACCEPT;
    if (!aici_regex_can_continue(re, s)) f |= ST_FINAL;
  }
  M->info[m][s] = f;
  return f;
}

/* The calls from (m, s): callee machine and the caller's state after the call marker. */
static const call_t *calls_of(matcher_t *M, uint32_t m, uint32_t s, uint32_t *n_out) {
  uint32_t h = mt_hash3(m, s, 7);
  uint32_t k = h & (M->calls_ht_cap - 1);
  for (; M->calls_ht[k].n; k = (k + 1) & (M->calls_ht_cap - 1))
    if (M->calls_ht[k].key_m == m && M->calls_ht[k].key_s == s) {
      *n_out = M->calls_ht[k].n - 1;
      return M->call_pool + M->calls_ht[k].off;
    }
  aici_regex_t *re = M->re[m];
  uint32_t off = M->call_pool_n, r = aici_regex_step(re, s, CALL_BYTE);
  for (uint32_t hi = 0; r && hi < 256; hi++) {
    uint32_t r2 = aici_regex_step(re, r, (uint8_t)hi);
    for (uint32_t lo = 0; r2 && lo < 256; lo++) {
      uint32_t r3 = aici_regex_step(re, r2, (uint8_t)lo), callee = hi << 8 | lo;
      if (!r3 || callee >= M->n) continue;   /* (ids are never taken back: M->n only grows) */
      if (M->call_pool_n == M->call_pool_cap)
        M->call_pool = aici_realloc(M->call_pool, (M->call_pool_cap = M->call_pool_cap ? 2 * M->call_pool_cap : 64) * sizeof(call_t));
      M->call_pool[M->call_pool_n++] = (call_t){callee, r3};
    }
  }
  if (2 * (M->calls_n + 1) > M->calls_ht_cap) {
    calls_ent_t *old = M->calls_ht;
    uint32_t oc = M->calls_ht_cap;
    M->calls_ht_cap *= 2;
    M->calls_ht = aici_calloc(M->calls_ht_cap, sizeof(calls_ent_t));
    for (uint32_t i = 0; i < oc; i++)
      if (old[i].n) {
        uint32_t j = mt_hash3(old[i].key_m, old[i].key_s, 7) & (M->calls_ht_cap - 1);
        while (M->calls_ht[j].n) j = (j + 1) & (M->calls_ht_cap - 1);
        M->calls_ht[j] = old[i];
      }
    aici_free(old);
    k = h & (M->calls_ht_cap - 1);
    while (M->calls_ht[k].n) k = (k + 1) & (M->calls_ht_cap - 1);
  }
  M->calls_ht[k] = (calls_ent_t){m, s, off, M->call_pool_n - off + 1};
  M->calls_n++;
  *n_out = M->call_pool_n - off;
  return M->call_pool + off;
}

static bool told_full;

static void add(cset_t *out, uint32_t m, uint32_t s, uint32_t parent, uint32_t n) {
  for (uint32_t i = 0; i < out->n; i++)
    if (out->c[i].m == m && out->c[i].s == s && out->c[i].parent == parent && out->c[i].n == n) return;
  if (out->n < MAX_CFGS) out->c[out->n++] = (cfg_t){m, s, parent, n};
  else if (!told_full) {               /* narrower, never wider: said once */
    told_full = true;
    aici_logs("json: over 16 open alternatives at once; the extra ones are not offered\n");
  }
}

static void step_cfg(matcher_t *M, uint32_t m, uint32_t s, uint32_t parent, uint32_t n, uint8_t byte, cset_t *out,
                     uint32_t depth) {
  uint16_t f = mt_state_info(M, m, s);
  uint32_t t = aici_regex_step(M->re[m], s, byte), n2 = 0;
  if (t && (!M->lc[m] || lencount_next(M->lc[m], t, n, byte, &n2))) add(out, m, t, parent, n2);
  if ((f & ST_CALLS) && depth < 32 && M->fr[parent].depth < MAX_STACK) {
    uint32_t n;
    const call_t *calls = calls_of(M, m, s, &n);
    for (uint32_t i = 0; i < n; i++) {
      uint32_t callee = calls[i].callee, ret = calls[i].ret;
      if (callee < M->n_static && M->dead[callee]) continue;   /* admits no value */
      if (!M->re[callee] && !ensure(M, callee)) { calls = calls_of(M, m, s, &n); continue; }
      calls = calls_of(M, m, s, &n);   /* ensure may have added calls to the pool */
      uint32_t p = mt_state_info(M, m, ret) & ST_FINAL ? parent : frame(M, m, ret, parent);
      step_cfg(M, callee, aici_regex_start(M->re[callee]), p, M->lc[callee] ? LC_PRE : 0, byte, out, depth + 1);
      calls = calls_of(M, m, s, &n);   /* the pool may have moved */
    }
  }
  if ((f & ST_ACCEPT) && parent && depth < 32) {
    frame_t fr = M->fr[parent];
    step_cfg(M, fr.m, fr.s, fr.parent, 0, byte, out, depth + 1);
  }
}

bool matcher_step(matcher_t *M, const cset_t *in, uint8_t byte, cset_t *out) {
  out->n = 0;
  if (byte == CALL_BYTE) return false;   /* never in UTF-8 text: only the machines' marker */
  for (uint32_t i = 0; i < in->n; i++) step_cfg(M, in->c[i].m, in->c[i].s, in->c[i].parent, in->c[i].n, byte, out, 0);
  return out->n > 0;
}

void matcher_start(matcher_t *M, cset_t *out) {
  out->n = 1;
  out->c[0] = (cfg_t){0, aici_regex_start(M->re[0]), 0, 0};
}

bool matcher_advance(matcher_t *M, cset_t *set, const uint8_t *bytes, uint32_t n) {
  cset_t tmp;
  for (uint32_t i = 0; i < n; i++) {
    if (!matcher_step(M, set, bytes[i], &tmp)) { set->n = 0; return false; }
    *set = tmp;
  }
  return set->n > 0;
}

static bool cfg_accepting(matcher_t *M, uint32_t m, uint32_t s, uint32_t parent, uint32_t depth) {
  if (!(mt_state_info(M, m, s) & ST_ACCEPT)) return false;
  if (!parent) return true;
  frame_t f = M->fr[parent];
  return depth < MAX_STACK && cfg_accepting(M, f.m, f.s, f.parent, depth + 1);
}

bool matcher_accepting(matcher_t *M, const cset_t *set) {
  for (uint32_t i = 0; i < set->n; i++)
    if (cfg_accepting(M, set->c[i].m, set->c[i].s, set->c[i].parent, 0)) return true;
  return false;
}

int matcher_forced_byte(matcher_t *M, const cset_t *set) {
  if (matcher_accepting(M, set)) return -1;
  int found = -1;
  cset_t tmp;
  for (int b = 0; b < 256; b++) {
    if (!matcher_step(M, set, (uint8_t)b, &tmp)) continue;
    if (found >= 0) return -1;
    found = b;
  }
  return found;
}
