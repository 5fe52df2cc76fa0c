/* lexer.c - the grammar matcher's lexer: lexer states (interned lists of (terminal, regex
 * state) pairs, live terminals only), their transition rows built lazily, start states per
 * set of allowed terminals, and the byte classes of all terminals together. */
#include "matcher_impl.h"

/* ---- lexer states ------------------------------------------------------------------------ */
static uint32_t hash_pairs(const uint32_t *p, uint32_t n) {
  uint32_t h = 2166136261u;
  for (uint32_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h ? h : 1;
}

/* The lexer state for pairs p[0..2n) (sorted by terminal), interned. */
uint32_t gm_lex_intern(gr_matcher_t *m, const uint32_t *p, uint32_t n) {
  if (!n) return 0;
  uint32_t h = hash_pairs(p, 2 * n);
  if ((m->n_ls + 1) * 2 > m->lht_cap) gm_lht_grow(m);
  uint32_t mask = m->lht_cap - 1, i = h & mask;
  while (m->lht[i]) {
    lstate_t *s = &m->ls[m->lht[i]];
    if (s->n == n && !__builtin_memcmp(m->pairs + s->off, p, 8 * n)) return m->lht[i];
    i = (i + 1) & mask;
  }
  if (m->n_ls == m->cap_ls) {
    m->cap_ls *= 2;
    m->ls = aici_realloc(m->ls, m->cap_ls * sizeof(lstate_t));
  }
  if (m->n_pairs + 3 * n > m->cap_pairs) {
    while (m->n_pairs + 3 * n > m->cap_pairs) m->cap_pairs *= 2;
    m->pairs = aici_realloc(m->pairs, m->cap_pairs * 4);
  }
  uint32_t id = m->n_ls++;
  ST(lexnew);
  lstate_t *s = &m->ls[id];
  s->off = m->n_pairs, s->n = n, s->row = 0, s->forced = s->stop = false, s->eager = -1;
  __builtin_memcpy(m->pairs + m->n_pairs, p, 8 * n);
  m->n_pairs += 2 * n;
  s->acc_off = m->n_pairs, s->n_acc = 0;
  for (uint32_t k = 0; k < n; k++) {
    gr_term_t *t = &m->g->terms[p[2 * k]];
    if (t->json ? gr_json_accepting(t->json, p[2 * k + 1]) : aici_regex_accepting(t->re, p[2 * k + 1])) {
      m->pairs[m->n_pairs++] = p[2 * k];
      s->n_acc++;
      if (t->lazy) s->forced = true;   /* a lazy lexeme ends at its first match */
      if (t->stop) s->stop = true;     /* ... and a stop lexeme only where a token ends */
    }
  }
  m->lht[i] = id;
  return id;
}

void gm_lht_grow(gr_matcher_t *m) {
  uint32_t cap = m->lht_cap ? m->lht_cap * 2 : 1024;
  aici_free(m->lht);
  m->lht = aici_calloc(cap, 4);
  m->lht_cap = cap;
  for (uint32_t id = 1; id < m->n_ls; id++) {
    lstate_t *s = &m->ls[id];
    uint32_t i = hash_pairs(m->pairs + s->off, 2 * s->n) & (cap - 1);
    while (m->lht[i]) i = (i + 1) & (cap - 1);
    m->lht[i] = id;
  }
}

/* State id's transition row (allocated on first use; -1: not computed yet). Rows do not move
 * when m->ls grows. */
const int32_t *gm_lex_row(gr_matcher_t *m, uint32_t id) {
  lstate_t *s = &m->ls[id];
  if (!s->row) {
    s->row = aici_malloc(256 * 4);
    for (int k = 0; k < 256; k++) s->row[k] = s->forced ? 0 : -1;
  }
  return s->row;
}

uint32_t gm_lex_next(gr_matcher_t *m, uint32_t id, uint8_t b) {
  gm_lex_row(m, id);
  lstate_t *s = &m->ls[id];
  int32_t r = s->row[b];
  if (r >= 0) return (uint32_t)r;
  ST(lexmiss);
  if (m->cap_tmp < 2 * s->n) { m->cap_tmp = 2 * s->n; m->tmp_pairs = aici_realloc(m->tmp_pairs, m->cap_tmp * 4); }
  uint32_t n = 0, off = s->off, cnt = s->n;
  for (uint32_t k = 0; k < cnt; k++) {
    uint32_t t = m->pairs[off + 2 * k];
    const gr_term_t *x = &m->g->terms[t];
    uint32_t st = m->pairs[off + 2 * k + 1], ns = x->json ? gr_json_step(x->json, st, b) : aici_regex_step(x->re, st, b);
    if (ns) { m->tmp_pairs[2 * n] = t; m->tmp_pairs[2 * n + 1] = ns; n++; }
  }
  uint32_t id2 = gm_lex_intern(m, m->tmp_pairs, n);
  int32_t *row = m->ls[id].row;        /* (ls may have moved): every byte of b's class */
  for (uint32_t k = m->cls_off[m->bcls[b]], e = m->cls_off[m->bcls[b] + 1]; k < e; k++) row[m->cls_bytes[k]] = (int32_t)id2;
  return id2;
}

/* The lexer's start state for terminal bitset `bits` (interned per distinct set). */
uint32_t gm_lex_start(gr_matcher_t *m, const uint32_t *bits) {
  uint32_t rec = 1 + m->tw;
  for (uint32_t i = 0; i < m->n_starts; i += rec)
    if (!__builtin_memcmp(m->starts + i + 1, bits, 4 * m->tw)) return m->starts[i];
  uint32_t n = 0;
  if (m->cap_tmp < 2 * m->g->n_terms) { m->cap_tmp = 2 * m->g->n_terms; m->tmp_pairs = aici_realloc(m->tmp_pairs, m->cap_tmp * 4); }
  for (uint32_t t = 0; t < m->g->n_terms; t++)
    if ((bits[t >> 5] >> (t & 31)) & 1 && (m->g->terms[t].re || m->g->terms[t].json)) {
      gr_term_t *x = &m->g->terms[t];
      m->tmp_pairs[2 * n] = t;
      m->tmp_pairs[2 * n + 1] = x->json ? gr_json_start(x->json) : aici_regex_start(x->re);
      n++;
    }
  uint32_t id = gm_lex_intern(m, m->tmp_pairs, n);
  if (m->n_starts + rec > m->cap_starts) {
    m->cap_starts = (m->n_starts + rec) * 2;
    m->starts = aici_realloc(m->starts, m->cap_starts * 4);
  }
  m->starts[m->n_starts] = id;
  __builtin_memcpy(m->starts + m->n_starts + 1, bits, 4 * m->tw);
  m->n_starts += rec;
  return id;
}

/* The byte classes of all terminals together: the common refinement of each regex's classes
 * (two bytes share a class iff they share one in every terminal's regex). */
void gm_byte_classes(gr_matcher_t *m) {
  uint32_t n = 1;
  static uint16_t map[256 * 256];      /* (class so far, this regex's class) -> new class + 1 */
  uint16_t used[256];
  __builtin_memset(m->bcls, 0, 256);
  for (uint32_t t = 0; t < m->g->n_terms; t++) {
    const gr_term_t *x = &m->g->terms[t];
    if (!x->re && !x->json) continue;
    const uint8_t *c = x->json ? 0 : aici_regex_classes(x->re, 0);   /* %json: each byte its own */
    uint32_t nk = 0;
    for (int b = 0; b < 256; b++) {
      uint32_t key = (uint32_t)m->bcls[b] << 8 | (c ? c[b] : (uint32_t)b);
      if (!map[key]) map[key] = (uint16_t)++nk, used[nk - 1] = (uint16_t)key;
      m->bcls[b] = (uint8_t)(map[key] - 1);
    }
    for (uint32_t k = 0; k < nk; k++) map[used[k]] = 0;
    n = nk;
  }
  uint32_t at = 0;
  for (uint32_t c = 0; c < n; c++) {
    m->cls_off[c] = (uint16_t)at;
    for (int b = 0; b < 256; b++)
      if (m->bcls[b] == c) m->cls_bytes[at++] = (uint8_t)b;
  }
  m->cls_off[n] = (uint16_t)at;
  m->n_cls = n;
}
