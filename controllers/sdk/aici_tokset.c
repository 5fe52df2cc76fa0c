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
void aici_tokset_and(aici_tokset_t *d, const aici_tokset_t *s) {
  for (uint32_t i = 0; i < d->n_words; i++) d->words[i] &= s->words[i];
}
void aici_tokset_or(aici_tokset_t *d, const aici_tokset_t *s) {
  for (uint32_t i = 0; i < d->n_words; i++) d->words[i] |= s->words[i];
}
void aici_tokset_sub(aici_tokset_t *d, const aici_tokset_t *s) {
  for (uint32_t i = 0; i < d->n_words; i++) d->words[i] &= ~s->words[i];
}
uint32_t aici_tokset_count(const aici_tokset_t *s) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->n_words; i++) n += __builtin_popcount(s->words[i]);
  return n;
}
