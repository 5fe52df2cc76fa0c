/* aici_cps_regex.c - a code-point set as SDK regex text over UTF-8 bytes: the ranges split at
 * each encoded length and at each continuation-byte boundary (regex-syntax's utf8 split), then
 * factored by shared leading byte ranges, so a class such as Unicode \w stays a small NFA. */
#include "aici.h"

void aici_cps_scalars(aici_cp_set_t *s) {
  aici_cps_normalize(s);
  aici_cp_set_t o = {0};
  for (uint32_t i = 0; i < s->n; i++) {
    uint32_t lo = s->r[i].lo, hi = s->r[i].hi > 0x10FFFF ? 0x10FFFF : s->r[i].hi;
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (lo < 0xD800) aici_cps_add(&o, lo, 0xD7FF);
      if (hi > 0xDFFF) aici_cps_add(&o, 0xE000, hi);
    } else aici_cps_add(&o, lo, hi);
  }
  aici_free(s->r);
  *s = o;
}

/* A UTF-8 sequence of byte ranges: [lo[k], hi[k]] for k < n. */
typedef struct { uint8_t n, lo[4], hi[4]; } seq_t;
typedef struct { seq_t *s; uint32_t n, cap; } seqs_t;

/* [lo, hi] of one encoded length as sequences of byte ranges. */
static void utf8_seqs(seqs_t *o, uint32_t lo, uint32_t hi) {
  uint8_t tmp[4];
  uint32_t n = aici_utf8_encode(lo, tmp);
  for (uint32_t i = 1; i < n; i++) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if (lo & m) { utf8_seqs(o, lo, lo | m); utf8_seqs(o, (lo | m) + 1, hi); return; }
      if ((hi & m) != m) { utf8_seqs(o, lo, (hi & ~m) - 1); utf8_seqs(o, hi & ~m, hi); return; }
    }
  }
  if (o->n == o->cap) { o->cap = o->cap ? o->cap * 2 : 64; o->s = aici_realloc(o->s, o->cap * sizeof(seq_t)); }
  seq_t *q = &o->s[o->n++];
  q->n = (uint8_t)n;
  aici_utf8_encode(lo, q->lo);
  aici_utf8_encode(hi, q->hi);
}

static void emit_range(aici_buf_t *b, uint8_t lo, uint8_t hi) {
  if (lo == hi) { aici_buf_rx_byte(b, lo); return; }
  aici_buf_putc(b, '['); aici_buf_rx_byte(b, lo); aici_buf_putc(b, '-'); aici_buf_rx_byte(b, hi); aici_buf_putc(b, ']');
}

/* Sequences s[0..n) (sorted, from position `at` on) as an alternation factored by shared
 * leading ranges: a trie of byte ranges. */
static void emit_seqs(aici_buf_t *b, const seq_t *s, uint32_t n, uint32_t at) {
  bool many = n > 1;
  if (many) aici_buf_puts(b, "(?:");
  for (uint32_t i = 0; i < n;) {
    uint32_t j = i + 1;
    while (j < n && s[j].n > at && s[i].n > at && s[j].lo[at] == s[i].lo[at] && s[j].hi[at] == s[i].hi[at]) j++;
    if (i) aici_buf_putc(b, '|');
    emit_range(b, s[i].lo[at], s[i].hi[at]);
    if (s[i].n > at + 1) emit_seqs(b, s + i, j - i, at + 1);
    i = j;
  }
  if (many) aici_buf_putc(b, ')');
}

static bool seq_less(const seq_t *a, const seq_t *b) {
  for (uint32_t k = 0; k < 4; k++) {
    uint32_t x = k < a->n ? (uint32_t)a->lo[k] << 8 | a->hi[k] : 0, y = k < b->n ? (uint32_t)b->lo[k] << 8 | b->hi[k] : 0;
    if (x != y) return x < y;
  }
  return a->n < b->n;
}

bool aici_cps_regex(aici_buf_t *b, aici_cp_set_t *s) {
  aici_cps_scalars(s);
  if (!s->n) { aici_buf_puts(b, "[^\\x00-\\xff]"); return false; }   /* matches nothing */
  aici_buf_puts(b, "(?:");
  bool first = true;
  if (s->r[0].lo < 0x80) {             /* the one-byte part as one class */
    aici_buf_putc(b, '[');
    for (uint32_t i = 0; i < s->n && s->r[i].lo < 0x80; i++) {
      uint32_t hi = s->r[i].hi < 0x7F ? s->r[i].hi : 0x7F;
      aici_buf_rx_byte(b, (uint8_t)s->r[i].lo);
      if (hi != s->r[i].lo) { aici_buf_putc(b, '-'); aici_buf_rx_byte(b, (uint8_t)hi); }
    }
    aici_buf_putc(b, ']');
    first = false;
  }
  static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  seqs_t q = {0};
  for (uint32_t i = 0; i < s->n; i++) {
    uint32_t lo = s->r[i].lo < 0x80 ? 0x80 : s->r[i].lo, hi = s->r[i].hi;
    for (int k = 1; k < 4 && lo <= hi; k++) {
      if (lo > bounds[k]) continue;
      uint32_t h = hi < bounds[k] ? hi : bounds[k];
      utf8_seqs(&q, lo, h);
      lo = h + 1;
    }
  }
  for (uint32_t i = 1; i < q.n; i++)   /* insertion sort: lists are small (a few thousand at most) */
    for (uint32_t j = i; j > 0 && seq_less(&q.s[j], &q.s[j - 1]); j--) { seq_t t = q.s[j]; q.s[j] = q.s[j - 1]; q.s[j - 1] = t; }
  if (q.n) {
    if (!first) aici_buf_putc(b, '|');
    emit_seqs(b, q.s, q.n, 0);
  }
  aici_free(q.s);
  aici_buf_putc(b, ')');
  return true;
}
