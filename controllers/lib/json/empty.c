/* Questions about languages the compiler asks. Which machines admit no value: a regex may be non-empty as text yet every string of it call a
 * machine whose own language is empty (a required property whose schema admits nothing, an
 * exact oneOf none of whose branches can be the only one). The language of machine i is
 * non-empty ("productive") iff some path from its start to a match takes calls only into
 * productive machines: the least fixpoint, by a search of each machine's NFA. Calls into the
 * others are then written out of the texts, so that their DFAs know those paths are dead and
 * masks never offer a way into them. */
#include "json.h"

typedef struct { const bool *prod; uint32_t n; } callees_t;

static bool callee_productive(void *ctx, uint32_t id) {
  const callees_t *c = ctx;
  return id < c->n && c->prod[id];
}

/* Does `re` match some string whose calls all go into prod[] machines? Decided on its NFA
 * (aici_regex_productive): a breadth-first search of its DFA built hundreds of rows a schema,
 * most of a first call's regex work, for rows no mask may ever need. */
static bool reaches_accept(aici_regex_t *re, const bool *prod, uint32_t n) {
  callees_t c = {prod, n};
  return aici_regex_productive(re, CALL_BYTE, callee_productive, &c);
}

void machines_productive(aici_regex_t *const *re, lencount_t *const *lc, uint32_t n, bool *prod) {
  for (uint32_t i = 0; i < n; i++) {
    prod[i] = !re[i];                  /* dynamic machines (made later): productive */
    if (re[i] && lc[i]) prod[i] = lencount_live(lc[i], aici_regex_start(re[i]), LC_PRE);
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t i = n; i-- > 0;)     /* callees mostly come after their callers */
      if (!prod[i] && re[i] && !lc[i] && reaches_accept(re[i], prod, n)) prod[i] = true, changed = true;
  }
}

/* One token of regex text at t[i]: its length, and in *byte the byte it stands for (-1: none). */
static uint32_t token_at(const char *t, uint32_t len, uint32_t i, int *byte) {
  static const char hex[] = "0123456789abcdef";
  *byte = -1;
  if (t[i] == '\\' && i + 3 < len && t[i + 1] == 'x') {
    int h = -1, l = -1;
    for (int k = 0; k < 16; k++) h = t[i + 2] == hex[k] ? k : h, l = t[i + 3] == hex[k] ? k : l;
    if (h >= 0 && l >= 0) { *byte = h << 4 | l; return 4; }
  }
  if (t[i] == '\\') return i + 1 < len ? 2 : 1;
  uint8_t c = (uint8_t)t[i];
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') *byte = c;
  return 1;
}

char *text_without_dead_calls(const char *t, uint32_t len, const bool *prod, uint32_t n, uint32_t *out_len) {
  aici_buf_t out = {0};
  bool changed = false, in_class = false;
  uint32_t i = 0, copied = 0;
  while (i < len) {
    int b0, b1, b2;
    uint32_t l0 = token_at(t, len, i, &b0);
    if (!in_class && t[i] == '[') { in_class = true, i++; continue; }
    if (in_class) {
      if (t[i] == ']') in_class = false;
      i += l0;
      continue;
    }
    if (b0 == CALL_BYTE && i + l0 < len) {
      uint32_t l1 = token_at(t, len, i + l0, &b1);
      if (b1 >= 0 && i + l0 + l1 < len) {
        uint32_t l2 = token_at(t, len, i + l0 + l1, &b2);
        uint32_t callee = (uint32_t)b1 << 8 | (uint32_t)(b2 < 0 ? 0 : b2);
        if (b2 >= 0 && callee < n && !prod[callee]) {
          aici_buf_putn(&out, t + copied, i - copied);
          aici_buf_puts(&out, "[^\\x00-\\xff]");
          i += l0 + l1 + l2, copied = i, changed = true;
          continue;
        }
      }
    }
    i += l0;
  }
  if (!changed) { aici_free(out.p); return 0; }
  aici_buf_putn(&out, t + copied, len - copied);
  *out_len = out.n;
  return out.p;
}

/* ---- inclusion ------------------------------------------------------------------------------- */
#define SUBSET_PAIRS 16384u            /* product states one check visits at most (past it: no) */

bool regex_subset(const char *a, uint32_t na, const char *b, uint32_t nb) {
  aici_regex_t *A = aici_regex_compile(a, na, 0), *B = aici_regex_compile(b, nb, 0);
  if (!A || !B) return false;
  const uint8_t *ca = aici_regex_classes(A, 0), *cb = aici_regex_classes(B, 0);
  uint8_t rep[256];                    /* one byte per joint class */
  uint32_t n_rep = 0;
  uint16_t seen_pair[256];
  uint32_t n_seen = 0;
  for (uint32_t x = 0; x < 256; x++) {
    if (x == CALL_BYTE) continue;
    uint16_t key = (uint16_t)(ca[x] << 8 | cb[x]);
    bool dup = false;
    for (uint32_t k = 0; k < n_seen && !dup; k++) dup = seen_pair[k] == key;
    if (!dup) seen_pair[n_seen++] = key, rep[n_rep++] = (uint8_t)x;
  }
  uint32_t cap = 4096, n = 0, head = 0;
  uint64_t *q = aici_malloc(SUBSET_PAIRS * 8);
  uint32_t *ht = aici_calloc(cap, 4);  /* open addressing over q indices + 1 */
  bool subset = true;
  uint64_t start = (uint64_t)aici_regex_start(A) << 32 | aici_regex_start(B);
  if (start >> 32) q[n++] = start;
  while (head < n && subset) {
    uint64_t p = q[head++];
    uint32_t sa = (uint32_t)(p >> 32), sb = (uint32_t)p;
    if (aici_regex_accepting(A, sa) && !(sb && aici_regex_accepting(B, sb))) { subset = false; break; }
    for (uint32_t k = 0; k < n_rep && subset; k++) {
      uint32_t ta = aici_regex_step(A, sa, rep[k]);
      if (!ta) continue;               /* (a live A state: some string from it is in A) */
      uint32_t tb = sb ? aici_regex_step(B, sb, rep[k]) : 0;
      if (!tb) { subset = false; break; }   /* that string is in A, not in B */
      uint64_t t = (uint64_t)ta << 32 | tb;
      uint32_t h = (uint32_t)(t * 0x9e3779b97f4a7c15ull >> 40);
      bool dup = false;
      for (uint32_t j = h & (cap - 1); ht[j]; j = (j + 1) & (cap - 1))
        if (q[ht[j] - 1] == t) { dup = true; break; }
      if (dup) continue;
      if (n == SUBSET_PAIRS || 2 * n >= cap * 1) {
        if (n == SUBSET_PAIRS) { subset = false; break; }   /* too large to tell: no */
        aici_free(ht);
        cap *= 2;
        ht = aici_calloc(cap, 4);
        for (uint32_t i = 0; i < n; i++) {
          uint32_t hi = (uint32_t)(q[i] * 0x9e3779b97f4a7c15ull >> 40), j = hi & (cap - 1);
          while (ht[j]) j = (j + 1) & (cap - 1);
          ht[j] = i + 1;
        }
      }
      uint32_t j = h & (cap - 1);
      while (ht[j]) j = (j + 1) & (cap - 1);
      ht[j] = n + 1;
      q[n++] = t;
    }
  }
  aici_free(q), aici_free(ht);
  return subset;
}
