/* The regex's automata: the Thompson NFA (compiled back to front, fragments shared), its byte
 * classes and candidate slices, and the DFA built lazily row by row (see aici_regex_int.h). */
#include "aici_regex_int.h"

/* ---- NFA (compiled back to front: each fragment is built knowing its successor) --------- */
uint32_t rx_nfa_new(aici_regex_t *re, uint8_t kind, uint32_t out, uint32_t out1, uint32_t set) {
  if (re->n_nfa >= MAX_NFA) { re->overflow = true; return 0; }
  if (re->n_nfa == re->cap_nfa) {
    re->cap_nfa = re->cap_nfa ? 2 * re->cap_nfa : 64;
    re->nfa = aici_realloc(re->nfa, re->cap_nfa * sizeof(nfa_t));
  }
  nfa_t *s = &re->nfa[re->n_nfa];
  s->kind = kind, s->live = 0, s->out = out, s->out1 = out1, s->set = set;
  return re->n_nfa++;
}

/* Fragment sharing: the NFA of a subexpression depends only on its structure and on its
 * successor, so structurally equal subexpressions (canon[]: one id per structure) compiled before
 * the same successor share one fragment. Schema-made patterns repeat the same pieces (a string
 * character, "any other key" after each key prefix): unshared, each copy got its own DFA states. */

static uint32_t hash2(uint32_t a, uint32_t b) {
  uint32_t h = (a * 0x9e3779b1u) ^ (b + 0x7f4a7c15u + (a << 6) + (a >> 2));
  return h ^ (h >> 16);
}

static uint32_t *memo_slot(frag_t *f, uint32_t node, uint32_t next) {
  uint32_t k = hash2(f->canon[node], next) & (f->cap - 1);
  for (;; k = (k + 1) & (f->cap - 1)) {
    uint32_t *e = f->memo + 3 * k;
    if (!e[2] || (e[0] == f->canon[node] && e[1] == next)) return e;
  }
}

static void memo_put(frag_t *f, uint32_t node, uint32_t next, uint32_t state) {
  if (2 * (f->n + 1) > f->cap) {
    uint32_t *old = f->memo, oc = f->cap;
    f->cap = 2 * oc;
    f->memo = aici_calloc(f->cap, 12);
    f->n = 0;
    for (uint32_t i = 0; i < oc; i++)
      if (old[3 * i + 2]) {
        uint32_t k = hash2(old[3 * i], old[3 * i + 1]) & (f->cap - 1);
        while (f->memo[3 * k + 2]) k = (k + 1) & (f->cap - 1);
        __builtin_memcpy(f->memo + 3 * k, old + 3 * i, 12);
        f->n++;
      }
    aici_free(old);
  }
  uint32_t *e = memo_slot(f, node, next);
  if (!e[2]) f->n++;
  e[0] = f->canon[node], e[1] = next, e[2] = state + 1;
}

uint32_t rx_compile(aici_regex_t *re, frag_t *f, uint32_t node, uint32_t next) {
  const ast_t *x = &f->ast[node];
  if (x->kind == A_EMPTY) return next;
  uint32_t *e = memo_slot(f, node, next);
  if (e[2]) return e[2] - 1;
  uint32_t out;
  switch (x->kind) {
    case A_SET: out = rx_nfa_new(re, N_CONSUME, next, 0, x->set); break;
    case A_CAT: out = rx_compile(re, f, x->a, rx_compile(re, f, x->b, next)); break;
    case A_ALT: {
      uint32_t a = rx_compile(re, f, x->a, next), b = rx_compile(re, f, x->b, next);
      out = rx_nfa_new(re, N_SPLIT, a, b, 0);
      break;
    }
    default: {                         /* A_REP */
      uint32_t tail = next;
      if (x->max < 0) {                /* loop: L -> body -> L | next */
        uint32_t loop = rx_nfa_new(re, N_SPLIT, 0, next, 0);
        uint32_t body = rx_compile(re, f, x->a, loop);
        if (!re->overflow) re->nfa[loop].out = body;
        tail = loop;
      } else {
        for (int32_t i = x->min; i < x->max && !re->overflow; i++)  /* optional copies */
          tail = rx_nfa_new(re, N_SPLIT, rx_compile(re, f, x->a, tail), next, 0);
      }
      for (int32_t i = 0; i < x->min && !re->overflow; i++) tail = rx_compile(re, f, x->a, tail);
      out = tail;
    }
  }
  memo_put(f, node, next, out);
  return out;
}

/* canon[i]: one id per structure (children come before parents: ids are in parse order); byte
 * sets by their id (each set is held once: own_set). */
uint32_t *rx_canonical_ids(const aici_regex_t *re, const ast_t *ast, uint32_t n) {
  uint32_t *canon = aici_malloc(n * 4 + 4);
  uint32_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  uint32_t *ht = aici_calloc(cap, 4);      /* node ids + 1 */
  for (uint32_t i = 0; i < n; i++) {
    const ast_t *x = &ast[i];
    uint32_t a = x->kind == A_SET ? x->set : x->kind == A_EMPTY ? 0 : canon[x->a];
    uint32_t b = x->kind == A_CAT || x->kind == A_ALT ? canon[x->b] : (uint32_t)x->min * 65537u + (uint32_t)x->max;
    uint32_t k = hash2(hash2(x->kind, a), b) & (cap - 1);
    for (;; k = (k + 1) & (cap - 1)) {
      if (!ht[k]) { ht[k] = i + 1; canon[i] = i; break; }
      const ast_t *y = &ast[ht[k] - 1];
      if (y->kind != x->kind) continue;
      bool same = x->kind == A_EMPTY ||
                  (x->kind == A_SET && y->set == a) ||
                  ((x->kind == A_CAT || x->kind == A_ALT) && canon[y->a] == a && canon[y->b] == canon[x->b]) ||
                  (x->kind == A_REP && canon[y->a] == a && y->min == x->min && y->max == x->max);
      if (same) { canon[i] = canon[ht[k] - 1]; break; }
    }
  }
  aici_free(ht);
  return canon;
}

/* Keep only NFA states from which MATCH is reachable, so that a non-empty DFA state is always
 * a live one (matters for empty classes like [^\x00-\xff]). */
void rx_mark_live(aici_regex_t *re) {
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t i = 1; i < re->n_nfa; i++) {
      nfa_t *s = &re->nfa[i];
      if (s->live) continue;
      bool l = s->kind == N_MATCH ||
               (s->kind == N_CONSUME && re->nfa[s->out].live &&
                (re->sets[s->set][0] | re->sets[s->set][1] | re->sets[s->set][2] | re->sets[s->set][3] |
                 re->sets[s->set][4] | re->sets[s->set][5] | re->sets[s->set][6] | re->sets[s->set][7])) ||
               (s->kind == N_SPLIT && (re->nfa[s->out].live || re->nfa[s->out1].live));
      if (l) s->live = 1, changed = true;
    }
  }
}

/* Byte classes: the partition of 0..255 that every set of the pattern respects, refined once per
 * set (each set is held once, own_set: a schema's pattern made one set per literal byte, and
 * refining by each of those thousands of copies cost most of a schema's compile). */
void rx_byte_classes(aici_regex_t *re) {
  __builtin_memset(re->cls, 0, 256);
  re->n_cls = 1;
  uint8_t remap[256][2];
  for (uint32_t k = 0; k < re->n_sets; k++) {
    __builtin_memset(remap, 0xff, sizeof remap);
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
      int in = (re->sets[k][b >> 5] >> (b & 31)) & 1;
      uint8_t *m = &remap[re->cls[b]][in];
      if (*m == 0xff) *m = (uint8_t)n++;
      re->cls[b] = *m;
    }
    re->n_cls = n;
  }
  for (int b = 255; b >= 0; b--) re->rep[re->cls[b]] = (uint8_t)b;
}

/* ---- candidate slices: the byte sets under repeats ------------------------------------------ */
static void add_cand(aici_regex_t *re, const uint32_t *set) {
  uint32_t any = 0;
  for (int i = 0; i < 8; i++) any |= set[i];
  if (!any) return;
  for (uint32_t k = 0; k < re->n_cand; k++)
    if (same_set(re->cand[k], set)) return;
  if (re->n_cand < MAX_CAND) __builtin_memcpy(re->cand[re->n_cand++], set, 32);
}

/* The union of an alternation of sets; in text mode, one of its branches may be "any multi-byte
 * character" (*u8 set): then its tokens are a UTF-8 slice's (see aici_trie_utf8_slice). */
static bool alt_union(const aici_regex_t *re, const ast_t *ast, uint32_t node, uint32_t *u, bool *u8) {
  const ast_t *x = &ast[node];
  if (re->utf8_node && node == re->utf8_node - 1) return *u8 = true;
  if (x->kind == A_SET) {
    for (int i = 0; i < 8; i++) u[i] |= re->sets[x->set][i];
    return true;
  }
  return x->kind == A_ALT && alt_union(re, ast, x->a, u, u8) && alt_union(re, ast, x->b, u, u8);
}

static void add_cand_u8(aici_regex_t *re, const uint32_t *set) {
  for (uint32_t k = 0; k < re->n_cand_u8; k++)
    if (!__builtin_memcmp(re->cand_u8[k], set, 16)) return;
  if (re->n_cand_u8 < MAX_CAND_U8) __builtin_memcpy(re->cand_u8[re->n_cand_u8++], set, 16);
}

void rx_collect(aici_regex_t *re, const ast_t *ast, uint32_t node, bool rep) {
  for (;;) {
    const ast_t *x = &ast[node];
    if (re->utf8_node && node == re->utf8_node - 1) return;   /* its byte sets slice nothing */
    switch (x->kind) {
      case A_SET:
        if (rep) add_cand(re, re->sets[x->set]);
        return;
      case A_ALT:                      /* a text-mode class: its ASCII set beside any character */
        if (rep && re->utf8_node && x->b == re->utf8_node - 1 && ast[x->a].kind == A_SET)
          add_cand_u8(re, re->sets[ast[x->a].set]);
        /* fall through */
      case A_CAT:                      /* CAT chains are left-deep: loop on the left side */
        rx_collect(re, ast, x->b, rep);
        node = x->a;
        continue;
      case A_REP: {
        bool r = rep || x->max < 0 || x->max >= REP_MIN;
        uint32_t u[8] = {0};
        bool u8 = false;
        if (r && ast[x->a].kind == A_ALT && alt_union(re, ast, x->a, u, &u8)) {
          if (u8) add_cand_u8(re, u);      /* its ASCII part: the words u[0..3] */
          else add_cand(re, u);
        }
        rep = r;
        node = x->a;
        continue;
      }
      default: return;
    }
  }
}

/* ---- DFA ---------------------------------------------------------------------------------- */
void rx_closure(aici_regex_t *re, uint32_t s, uint32_t *n) {
  uint32_t sp = 0;
  re->stk[sp++] = s;
  while (sp) {
    uint32_t q = re->stk[--sp];
    if (re->mark[q] == re->gen || !re->nfa[q].live) continue;
    re->mark[q] = re->gen;
    nfa_t *x = &re->nfa[q];
    if (x->kind == N_SPLIT) re->stk[sp++] = x->out1, re->stk[sp++] = x->out;
    else re->list[(*n)++] = q;         /* CONSUME or MATCH */
  }
}

static void sort_u32(uint32_t *a, uint32_t n) {   /* shellsort: sets are small, no recursion */
  for (uint32_t gap = n / 2; gap; gap /= 2)
    for (uint32_t i = gap; i < n; i++) {
      uint32_t v = a[i], j = i;
      for (; j >= gap && a[j - gap] > v; j -= gap) a[j] = a[j - gap];
      a[j] = v;
    }
}

bool rx_grow_states(aici_regex_t *re) {
  uint32_t cap = re->cap_states ? 2 * re->cap_states : 16;
  uint32_t *trans = aici_realloc(re->trans, (size_t)cap * 1024);
  if (!trans) return false;
  re->trans = trans;
  re->flags = aici_realloc(re->flags, cap);
  re->set_off = aici_realloc(re->set_off, cap * 4);
  re->set_len = aici_realloc(re->set_len, cap * 4);
  re->set_hash = aici_realloc(re->set_hash, cap * 4);
  re->cache = aici_realloc(re->cache, cap * sizeof(void *));
  __builtin_memset(re->cache + re->cap_states, 0, (cap - re->cap_states) * sizeof(void *));
  re->pick = aici_realloc(re->pick, cap);
  re->stamp = aici_realloc(re->stamp, cap * 4);
  __builtin_memset(re->stamp + re->cap_states, 0, (cap - re->cap_states) * 4);
  __builtin_memset(re->pick + re->cap_states, 0, cap - re->cap_states);
  re->cap_states = cap;
  /* rehash into a table at most half full */
  aici_free(re->ht);
  re->ht_cap = 4 * cap;
  re->ht = aici_calloc(re->ht_cap, 4);
  for (uint32_t d = 1; d < re->n_states; d++) {
    uint32_t h = re->set_hash[d] & (re->ht_cap - 1);
    while (re->ht[h]) h = (h + 1) & (re->ht_cap - 1);
    re->ht[h] = d;
  }
  return true;
}

/* The DFA state for the NFA-state list in re->list[0..n); 0 if empty or out of room. */
uint32_t rx_intern(aici_regex_t *re, uint32_t n) {
  if (!n) return 0;
  uint32_t *l = re->list;
  sort_u32(l, n);
  uint32_t h = 2166136261u;
  for (uint32_t i = 0; i < n; i++) h = (h ^ l[i]) * 16777619u;
  if (re->ht_cap) {
    for (uint32_t k = h & (re->ht_cap - 1); re->ht[k]; k = (k + 1) & (re->ht_cap - 1)) {
      uint32_t d = re->ht[k];
      if (re->set_hash[d] == h && re->set_len[d] == n &&
          !__builtin_memcmp(re->pool + re->set_off[d], l, n * 4))
        return d;
    }
  }
  if (re->n_states >= MAX_DFA) {
    if (!re->overflow) aici_logs("aici: regex DFA over 16384 states; treating the rest as dead\n");
    re->overflow = true;
    return 0;
  }
  if (re->n_states + 1 > re->cap_states && !rx_grow_states(re)) return 0;
  if (re->pool_len + n > re->pool_cap) {
    while (re->pool_len + n > re->pool_cap) re->pool_cap = re->pool_cap ? 2 * re->pool_cap : 1024;
    re->pool = aici_realloc(re->pool, re->pool_cap * 4);
  }
  uint32_t d = re->n_states++;
  __builtin_memcpy(re->pool + re->pool_len, l, n * 4);
  re->set_off[d] = re->pool_len, re->set_len[d] = n, re->set_hash[d] = h;
  re->pool_len += n;
  re->flags[d] = 0;
  re->flags[d] = FINAL;
  for (uint32_t i = 0; i < n; i++)
    re->flags[d] = re->nfa[l[i]].kind == N_MATCH ? re->flags[d] | ACCEPT : re->flags[d] & ~FINAL;
  __builtin_memset(re->trans + (size_t)d * 256, 0, 1024);
  uint32_t k = h & (re->ht_cap - 1);
  while (re->ht[k]) k = (k + 1) & (re->ht_cap - 1);
  re->ht[k] = d;
  return d;
}

/* The row of DFA state d. Byte classes that the same members of d's NFA-state list consume
 * (the same signature) lead to the same state: each signature's closure and lookup are done
 * once (inside a JSON string, most of the pattern's classes share one or two signatures). */
void rx_build_row(aici_regex_t *re, uint32_t d) {
  if (re->flags[d] & BUILT) return;
  uint32_t next[256], len = re->set_len[d];
  const uint32_t *members = re->pool + re->set_off[d];
  if (len <= 64) {
    uint64_t sig[256], seen_sig[256];
    uint32_t seen_next[256], n_seen = 0;
    __builtin_memset(sig, 0, re->n_cls * sizeof sig[0]);
    for (uint32_t i = 0; i < len; i++) {
      const nfa_t *x = &re->nfa[members[i]];
      if (x->kind != N_CONSUME) continue;
      const uint32_t *bs = re->sets[x->set];
      for (uint32_t c = 0; c < re->n_cls; c++) {
        uint8_t b = re->rep[c];
        sig[c] |= (uint64_t)((bs[b >> 5] >> (b & 31)) & 1) << i;
      }
    }
    for (uint32_t c = 0; c < re->n_cls; c++) {
      uint32_t k = 0;
      while (k < n_seen && seen_sig[k] != sig[c]) k++;
      if (k == n_seen) {
        uint32_t n = 0;
        re->gen++;
        for (uint64_t m = sig[c]; m; m &= m - 1)   /* pool may move in intern: re-read members */
          rx_closure(re, re->nfa[re->pool[re->set_off[d] + (uint32_t)__builtin_ctzll(m)]].out, &n);
        seen_sig[k] = sig[c], seen_next[k] = rx_intern(re, n), n_seen++;
      }
      next[c] = seen_next[k];
    }
  } else {
    for (uint32_t c = 0; c < re->n_cls; c++) {
      uint8_t b = re->rep[c];
      uint32_t n = 0;
      re->gen++;
      for (uint32_t i = 0; i < len; i++) {
        nfa_t *x = &re->nfa[re->pool[re->set_off[d] + i]];
        if (x->kind == N_CONSUME && (re->sets[x->set][b >> 5] >> (b & 31)) & 1) rx_closure(re, x->out, &n);
      }
      next[c] = rx_intern(re, n);
    }
  }
  for (uint32_t c = 0; c < re->n_cls; c++)
    if (next[c] && (re->flags[next[c]] & FINAL)) next[c] |= END_BIT;
  uint32_t *row = re->trans + (size_t)d * 256;  /* after intern: trans may have moved */
  for (int b = 0; b < 256; b++) row[b] = next[re->cls[b]];
  re->flags[d] |= BUILT;
}

uint32_t aici_regex_step(aici_regex_t *re, uint32_t state, uint8_t byte) {
  if (!state) return 0;
  rx_build_row(re, state);
  return re->trans[(size_t)state * 256 + byte] & ~END_BIT;
}

uint32_t aici_regex_advance(aici_regex_t *re, uint32_t state, const uint8_t *bytes, size_t n) {
  for (size_t i = 0; i < n && state; i++) state = aici_regex_step(re, state, bytes[i]);
  return state;
}

bool aici_regex_accepting(aici_regex_t *re, uint32_t state) { return re->flags[state] & ACCEPT; }

bool aici_regex_can_continue(aici_regex_t *re, uint32_t state) {
  if (!state) return false;
  rx_build_row(re, state);
  const uint32_t *row = re->trans + (size_t)state * 256;
  for (int b = 0; b < 256; b++)
    if (row[b]) return true;
  return false;
}
