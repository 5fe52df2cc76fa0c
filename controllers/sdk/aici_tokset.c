/* Token sets: bitsets over the vocabulary in the WIT `token-set` layout.
 * Every set has one hidden spare word after its n_words: trie walks write the bits of tokenless
 * nodes there (aici_trie_t.scratch_token) instead of testing for "no token" on every node. */
#include "aici.h"

static aici_tokset_t *init(aici_tokset_t *s, uint32_t *words) {
  s->vocab = aici_vocab_size();
  s->n_words = (s->vocab + 31) / 32;
  s->words = words;
  return s;
}

aici_tokset_t *aici_tokset_new(void) {
  aici_tokset_t *s = aici_malloc(sizeof *s);
  uint32_t n = (aici_vocab_size() + 31) / 32 + 1;
  uint32_t *w = aici_calloc(n, 4);
  if (!s || !w) return 0;
  return init(s, w);
}

aici_tokset_t *aici_tokset_tmp(void) {
  aici_tokset_t *s = aici_tmp_alloc(sizeof *s);
  uint32_t *w = aici_tmp_alloc(((aici_vocab_size() + 31) / 32 + 1) * 4);
  if (!s || !w) return 0;
  return init(s, w);
}

void aici_tokset_free(aici_tokset_t *s) {
  if (!s) return;
  aici_free(s->words);
  aici_free(s);                        /* no-op for arena sets: the heap does not own them */
}

void aici_tokset_clear(aici_tokset_t *s) { __builtin_memset(s->words, 0, s->n_words * 4); }

static void trim(aici_tokset_t *s) {   /* bits past the vocabulary must stay clear */
  if (s->vocab % 32) s->words[s->n_words - 1] &= (1u << (s->vocab % 32)) - 1;
}

void aici_tokset_fill(aici_tokset_t *s) {
  __builtin_memset(s->words, 0xff, s->n_words * 4);
  trim(s);
}

void aici_tokset_allow(aici_tokset_t *s, aici_token_t t) {
  if (t < s->vocab) s->words[t >> 5] |= 1u << (t & 31);
}
void aici_tokset_deny(aici_tokset_t *s, aici_token_t t) {
  if (t < s->vocab) s->words[t >> 5] &= ~(1u << (t & 31));
}
bool aici_tokset_has(const aici_tokset_t *s, aici_token_t t) {
  return t < s->vocab && (s->words[t >> 5] >> (t & 31)) & 1;
}

static void range(aici_tokset_t *s, aici_token_t lo, aici_token_t hi, bool on) {
  if (hi > s->vocab) hi = s->vocab;
  while (lo < hi && (lo & 31)) {       /* head bits, then whole words, then tail bits */
    if (on) aici_tokset_allow(s, lo); else aici_tokset_deny(s, lo);
    lo++;
  }
  while (lo + 32 <= hi) s->words[lo >> 5] = on ? ~0u : 0, lo += 32;
  for (; lo < hi; lo++) {
    if (on) aici_tokset_allow(s, lo); else aici_tokset_deny(s, lo);
  }
}
void aici_tokset_allow_range(aici_tokset_t *s, aici_token_t lo, aici_token_t hi) { range(s, lo, hi, true); }
void aici_tokset_deny_range(aici_tokset_t *s, aici_token_t lo, aici_token_t hi) { range(s, lo, hi, false); }

void aici_tokset_copy(aici_tokset_t *d, const aici_tokset_t *s) {
  __builtin_memcpy(d->words, s->words, d->n_words * 4);
}
/* Word loops on locals (the set structs could alias the words) and 16-byte vectors (SIMD128). */
typedef uint32_t v128u __attribute__((vector_size(16), aligned(4)));
#define WORD_LOOP(d, s, op)                                                                   \
  do {                                                                                        \
    uint32_t *restrict dw = (d)->words, n = (d)->n_words, i = 0;                              \
    const uint32_t *restrict sw = (s)->words;                                                 \
    for (; i + 4 <= n; i += 4) *(v128u *)(dw + i) op *(const v128u *)(sw + i);                \
    for (; i < n; i++) dw[i] op sw[i];                                                        \
  } while (0)
void aici_tokset_and(aici_tokset_t *d, const aici_tokset_t *s) { WORD_LOOP(d, s, &=); }
void aici_tokset_or(aici_tokset_t *d, const aici_tokset_t *s) { WORD_LOOP(d, s, |=); }
void aici_tokset_sub(aici_tokset_t *d, const aici_tokset_t *s) {
  uint32_t *restrict dw = d->words, n = d->n_words, i = 0;
  const uint32_t *restrict sw = s->words;
  for (; i + 4 <= n; i += 4) *(v128u *)(dw + i) &= ~*(const v128u *)(sw + i);
  for (; i < n; i++) dw[i] &= ~sw[i];
}
bool aici_tokset_empty(const aici_tokset_t *s) {
  for (uint32_t i = 0; i < s->n_words; i++)
    if (s->words[i]) return false;   /* most sets allow a token early on */
  return true;
}

uint32_t aici_tokset_count(const aici_tokset_t *s) {
  uint32_t c = 0;
  const uint32_t *w = s->words;
  for (uint32_t i = 0, n = s->n_words; i < n; i++) c += __builtin_popcount(w[i]);
  return c;
}
