/* earley.c - the grammar matcher's parser: Earley sets (items, closure, derivation), the scan
 * that ends a lexeme into a new set, the scan cache that keeps sets by (parent id, lexer state),
 * one byte's step (lexer, then parser when a lexeme ends), and special-token scans. */
#include "matcher_impl.h"

/* ---- Earley sets ------------------------------------------------------------------------- */
static uint32_t set_end(const gr_matcher_t *m, uint32_t k) {
  return k + 1 < m->valid ? m->sets[k + 1].start : m->n_items;
}

void gm_ht_reset(gr_matcher_t *m) {
  if (++m->gen == 0) {
    __builtin_memset(m->ht_stamp, 0, m->ht_cap * 4);
    m->gen = 1;
  }
}

void gm_add_item(gr_matcher_t *m, uint32_t prod, uint32_t dot, uint32_t origin, uint32_t set_start) {
  uint32_t h = (prod * 0x9E3779B1u) ^ (dot * 0x85EBCA77u) ^ (origin * 0xC2B2AE3Du);
  uint32_t n_set = m->n_items - set_start;
  if ((n_set + 1) * 2 > m->ht_cap) {   /* rebuild the table bigger */
    uint32_t cap = m->ht_cap * 2;
    aici_free(m->ht);
    aici_free(m->ht_stamp);
    m->ht = aici_malloc(cap * 4);
    m->ht_stamp = aici_calloc(cap, 4);
    m->ht_cap = cap;
    m->gen = 1;
    for (uint32_t k = set_start; k < m->n_items; k++) {
      item_t *it = &m->items[k];
      uint32_t hh = (it->prod * 0x9E3779B1u) ^ (it->dot * 0x85EBCA77u) ^ (it->origin * 0xC2B2AE3Du), i = hh & (cap - 1);
      while (m->ht_stamp[i] == m->gen) i = (i + 1) & (cap - 1);
      m->ht_stamp[i] = m->gen, m->ht[i] = k;
    }
  }
  uint32_t mask = m->ht_cap - 1, i = h & mask;
  while (m->ht_stamp[i] == m->gen) {
    item_t *it = &m->items[m->ht[i]];
    if (it->prod == prod && it->dot == dot && it->origin == origin) return;
    i = (i + 1) & mask;
  }
  if (m->n_items >= MAX_ITEMS) { m->overflow = true; return; }
  if (m->n_items == m->cap_items) {
    m->cap_items *= 2;
    m->items = aici_realloc(m->items, m->cap_items * sizeof(item_t));
  }
  m->ht_stamp[i] = m->gen, m->ht[i] = m->n_items;
  ST(items);
  m->items[m->n_items++] = (item_t){prod, dot, origin};
}

/* Predict and complete the set at index k (items from `start` to n_items). */
void gm_closure(gr_matcher_t *m, uint32_t k, uint32_t start) {
  gr_grammar_t *g = m->g;
  for (uint32_t w = start; w < m->n_items; w++) {
    item_t it = m->items[w];
    gr_prod_t *p = &g->prods[it.prod];
    if (it.dot < p->n) {
      uint32_t sym = p->syms[it.dot];
      if (!(sym & GR_NT)) continue;
      uint32_t nt = sym & ~GR_NT;
      for (uint32_t q = g->nt_first[nt], e = q + g->nt_count[nt]; q < e; q++) gm_add_item(m, q, 0, k, start);
      if (g->nullable[nt]) gm_add_item(m, it.prod, it.dot + 1, it.origin, start);
    } else if (it.origin != k) {
      uint32_t want = p->lhs | GR_NT;
      uint32_t os = m->sets[it.origin].start, oe = m->sets[it.origin + 1].start;
      for (uint32_t j = os; j < oe; j++) {
        item_t o = m->items[j];
        gr_prod_t *op = &g->prods[o.prod];
        if (o.dot < op->n && op->syms[o.dot] == want) gm_add_item(m, o.prod, o.dot + 1, o.origin, start);
      }
    }
  }
}

/* The set's derived fields: allowed terminals -> lexer start state; accepting. */
void gm_set_derive(gr_matcher_t *m, uint32_t k) {
  gr_grammar_t *g = m->g;
  __builtin_memset(m->scratch, 0, 4 * m->tw);
  bool acc = false;
  for (uint32_t w = m->sets[k].start, e = m->n_items; w < e; w++) {
    item_t it = m->items[w];
    gr_prod_t *p = &g->prods[it.prod];
    if (it.dot < p->n) {
      uint32_t s = p->syms[it.dot];
      if (!(s & GR_NT)) m->scratch[s >> 5] |= 1u << (s & 31);
    } else if (it.prod == g->start_prod && it.origin == 0) acc = true;
  }
  /* %ignore: between lexemes only, as llguidance: not before the first one, and only where
   * another lexeme may follow */
  bool any = false;
  for (uint32_t w = 0; w < m->tw; w++) any |= m->scratch[w] != 0;
  if (g->skip >= 0 && k > 0 && any) m->scratch[g->skip >> 5] |= 1u << (g->skip & 31);
  m->sets[k].accepting = acc;
  m->sets[k].lstart = gm_lex_start(m, m->scratch);
}

static void push_set(gr_matcher_t *m) {
  if (m->n_sets + 2 > m->cap_sets) {
    m->cap_sets *= 2;
    m->sets = aici_realloc(m->sets, m->cap_sets * sizeof(eset_t));
  }
}

/* ---- the scan cache ----------------------------------------------------------------------
 * A set is a function of its parent set and the lexer state scanned (completion reads the sets
 * below, which the parent's id names too): so the set built for (parent id, lexer state) a
 * second time is kept (under the first build's id), its items copied back when a later walk
 * (another mask of the same lexeme, the same token's other edges) scans the same pair from the
 * same set; a scan that advanced no item is kept as such at once. Sets built only once cost no
 * copy (a fresh fork writes every new page for the first time: it faults). Items are copied,
 * not rebuilt: no prediction, completion or dedup. Up to SC_ITEMS_MAX items and SC_SETS_MAX
 * sets per matcher; past them, sets are built as before. */
#define SC_ITEMS_MAX (1u << 17)        /* 1.5 MiB of items */
#define SC_SETS_MAX (1u << 15)
#define SC_ID_MAX 0xFFFFFF00u          /* set ids from here on would wrap: the cache stops */
struct scached { uint32_t pid, lex, id, off, n, lstart; bool accepting, kept; };

static uint32_t sc_hash(uint32_t pid, uint32_t lex) {
  uint32_t h = pid * 0x9E3779B1u ^ lex * 0x85EBCA77u;
  return h ^ (h >> 16);
}

/* The entry for (pid, lex), or NULL with *slot where to insert it (UINT32_MAX: table full). */
static scached_t *sc_find(gr_matcher_t *m, uint32_t pid, uint32_t lex, uint32_t *slot) {
  *slot = UINT32_MAX;
  if (!m->sc_tab_cap) return 0;
  for (uint32_t i = sc_hash(pid, lex) & (m->sc_tab_cap - 1);; i = (i + 1) & (m->sc_tab_cap - 1)) {
    uint32_t e = m->sc_tab[i];
    if (!e) { *slot = i; return 0; }
    scached_t *c = &m->sc[e - 1];
    if (c->pid == pid && c->lex == lex) return c;
  }
}

/* The set just built at the top (ok) or the failed gm_scan (!ok) into entry c: its items copied. */
static void sc_keep(gr_matcher_t *m, scached_t *c, bool ok) {
  uint32_t n = ok ? m->n_items - m->sets[m->n_sets - 1].start : 0;
  if (m->n_sc_items + n > SC_ITEMS_MAX) return;
  if (m->n_sc_items + n > m->cap_sc_items) {
    while (m->n_sc_items + n > m->cap_sc_items) m->cap_sc_items = m->cap_sc_items ? 2 * m->cap_sc_items : 4096;
    m->sc_items = aici_realloc(m->sc_items, m->cap_sc_items * sizeof(item_t));
  }
  c->off = m->n_sc_items, c->n = n, c->kept = true;
  if (ok) {
    eset_t *s = &m->sets[m->n_sets - 1];
    __builtin_memcpy(m->sc_items + m->n_sc_items, m->items + s->start, n * sizeof(item_t));
    m->n_sc_items += n;
    c->id = s->id, c->lstart = s->lstart, c->accepting = s->accepting;
  }
}

/* A new entry for (pid, lex) at table slot `slot`: a failed scan is kept at once (no items); a
 * set only when built a second time (sc_keep), so sets built once cost no copy. */
static void sc_insert(gr_matcher_t *m, uint32_t slot, uint32_t pid, uint32_t lex, bool ok) {
  if (m->n_sc >= SC_SETS_MAX) return;
  if ((m->n_sc + 1) * 2 > m->sc_tab_cap) {   /* grow (and first use): rehash */
    uint32_t cap = m->sc_tab_cap ? m->sc_tab_cap * 2 : 1024;
    aici_free(m->sc_tab);
    m->sc_tab = aici_calloc(cap, 4);
    m->sc_tab_cap = cap;
    for (uint32_t e = 0; e < m->n_sc; e++) {
      uint32_t i = sc_hash(m->sc[e].pid, m->sc[e].lex) & (cap - 1);
      while (m->sc_tab[i]) i = (i + 1) & (cap - 1);
      m->sc_tab[i] = e + 1;
    }
    sc_find(m, pid, lex, &slot);
  }
  if (m->n_sc == m->cap_sc) {
    m->cap_sc = m->cap_sc ? 2 * m->cap_sc : 256;
    m->sc = aici_realloc(m->sc, m->cap_sc * sizeof(scached_t));
  }
  scached_t *c = &m->sc[m->n_sc];
  *c = (scached_t){pid, lex, ok ? m->sets[m->n_sets - 1].id : 0, 0, 0, 0, false, false};
  m->sc_tab[slot] = ++m->n_sc;
  if (!ok) sc_keep(m, c, false);
}

/* gm_scan() from a cached entry: the same state as building it. */
static bool sc_restore(gr_matcher_t *m, const scached_t *c, uint32_t lex) {
  uint32_t k = m->n_sets - 1, j = m->n_sets;
  if (!c->n) return false;             /* no item advanced: nothing changes */
  uint32_t start = set_end(m, k);
  if (start + c->n > MAX_ITEMS) {      /* as the build would: a partial set is never kept */
    m->n_items = start;
    m->valid = j;
    m->overflow = true;
    return false;
  }
  ST(scan_cached);
  m->valid = j;
  push_set(m);
  while (start + c->n > m->cap_items) {
    m->cap_items *= 2;
    m->items = aici_realloc(m->items, m->cap_items * sizeof(item_t));
  }
  __builtin_memcpy(m->items + start, m->sc_items + c->off, c->n * sizeof(item_t));
  m->n_items = start + c->n;
  eset_t *s = &m->sets[j];
  s->start = start, s->lstart = c->lstart, s->accepting = c->accepting, s->id = c->id;
  s->prov_lex = (int32_t)lex, s->prov_parent = k;
  m->sets[j + 1].start = m->n_items;
  m->n_sets = m->valid = j + 1;
  return true;
}

static bool scan_build(gr_matcher_t *m, uint32_t lex);

/* Set n_sets (a new top) from the top set by scanning the terminals accepted in lexer state
 * `lex`; reuses it when the walk built the same one before. false: no item advanced. */
bool gm_scan(gr_matcher_t *m, uint32_t lex) {
  uint32_t k = m->n_sets - 1, j = m->n_sets;
  if (j < m->valid && m->sets[j].prov_lex == (int32_t)lex && m->sets[j].prov_parent == k) {
    ST(scan_reuse);
    m->n_sets++;
    return true;
  }
  uint32_t pid = m->sets[k].id, slot;
  if (m->next_id >= SC_ID_MAX) return scan_build(m, lex);   /* ids would wrap: no cache */
  scached_t *hit = sc_find(m, pid, lex, &slot);
  if (hit && hit->kept) return sc_restore(m, hit, lex);
  ST(scans);
  bool ok = scan_build(m, lex);
  if (m->overflow) return ok;
  if (hit) {                           /* built twice: keep it, under the first build's id */
    if (ok) m->sets[m->n_sets - 1].id = hit->id;
    sc_keep(m, hit, ok);
  }
  else sc_insert(m, slot, pid, lex, ok);
  return ok;
}

/* gm_scan() without the caches. */
static bool scan_build(gr_matcher_t *m, uint32_t lex) {
  uint32_t k = m->n_sets - 1, j = m->n_sets;
  /* rebuild at j: everything above is gone */
  m->n_items = set_end(m, k);
  m->valid = j;
  push_set(m);
  lstate_t *ls = &m->ls[lex];
  const uint32_t *acc = m->pairs + ls->acc_off;
  uint32_t n_acc = ls->n_acc;
  gr_grammar_t *g = m->g;
  uint32_t start = m->n_items;
  m->sets[j].start = start;
  m->sets[j + 1].start = start;
  gm_ht_reset(m);
  for (uint32_t w = m->sets[k].start, e = start; w < e; w++) {
    item_t it = m->items[w];
    gr_prod_t *p = &g->prods[it.prod];
    if (it.dot >= p->n || (p->syms[it.dot] & GR_NT)) continue;
    uint32_t s = p->syms[it.dot];
    for (uint32_t a = 0; a < n_acc; a++)
      if (acc[a] == s) { gm_add_item(m, it.prod, it.dot + 1, it.origin, start); break; }
  }
  if (m->n_items == start) return false;
  m->n_sets = j + 1;
  m->valid = j + 1;
  /* completion reads sets[origin + 1].start: the top set's end must read n_items */
  gm_closure(m, j, start);
  if (m->overflow) {                   /* a partial set is never kept: the caller sees a dead end */
    m->n_sets = m->valid = j;
    m->n_items = start;
    return false;
  }
  m->sets[j].prov_lex = (int32_t)lex;
  m->sets[j].prov_parent = k;
  m->sets[j].id = ++m->next_id;
  gm_set_derive(m, j);
  return true;
}

/* ---- stepping ---------------------------------------------------------------------------- */

/* End the current lexeme (lexer state `lex`, accepting): skip it when the %ignore terminal
 * matches it (that wins over grammar terminals matching the same text, as in llguidance), else
 * scan it. */
bool gm_emit(gr_matcher_t *m, uint32_t lex) {
  if (m->ls[lex].stop && !m->tok_start) return false;   /* a stop lexeme ends with its token */
  for (uint32_t a = 0; a < m->ls[lex].n_acc; a++)
    if ((int32_t)m->pairs[m->ls[lex].acc_off + a] == m->g->skip) return true;   /* skipped: same set */
  return gm_scan(m, lex);
}

/* One byte from position p; false when dead. On success p is the new position (the parser's
 * top may have moved up). */
bool gm_step(gr_matcher_t *m, pos_t *p, uint8_t b) {
  goto_pos(m, *p);
  uint32_t lex = p->lex, ns = gm_lex_next(m, lex, b);
  if (ns) { p->lex = ns; p->at_start = false; return true; }
  for (uint32_t k = 0; k < MAX_EMPTY; k++) {
    if (!m->ls[lex].n_acc) return false;
    if (!gm_emit(m, lex)) return false;
    lex = m->sets[m->n_sets - 1].lstart;
    ns = gm_lex_next(m, lex, b);
    if (ns) { p->n_sets = m->n_sets; p->lex = ns; p->at_start = false; return true; }
  }
  return false;
}

static bool pos_accepting_at(gr_matcher_t *m, pos_t p);
bool gm_pos_accepting(gr_matcher_t *m, pos_t p) {
  goto_pos(m, p);
  m->tok_start = true;                 /* EOS is a token of its own */
  bool a = pos_accepting_at(m, p);
  m->tok_start = false;
  return a;
}

static bool pos_accepting_at(gr_matcher_t *m, pos_t p) {
  if (p.at_start && m->sets[p.n_sets - 1].accepting) return true;
  uint32_t lex = p.lex;
  for (uint32_t k = 0; k < MAX_EMPTY; k++) {
    if (!m->ls[lex].n_acc || !gm_emit(m, lex)) return false;
    if (m->sets[m->n_sets - 1].accepting) return true;
    lex = m->sets[m->n_sets - 1].lstart;
  }
  return false;
}

/* ---- special tokens ---------------------------------------------------------------------
 * A special-token terminal is matched by token id. Its scan goes through a fake lexer state that
 * accepts exactly the terminals holding the token (no bytes, no transitions), so a set built for
 * it is reused as any other. */
static bool term_has(const gr_term_t *t, aici_token_t tok) {
  for (uint32_t k = 0; k < t->n_tok_ranges; k++)
    if (tok >= t->tok_ranges[2 * k] && tok <= t->tok_ranges[2 * k + 1]) return true;
  return false;
}

/* The fake state for key (a special-token terminal's id + 1; 0x80000000 | token: every terminal
 * holding it; 0x40000000 | terminal: that terminal, a max_tokens lexeme cut short). */
uint32_t gm_spec_state(gr_matcher_t *m, uint32_t key) {
  for (uint32_t k = 0; k < m->n_spec; k++)
    if (m->spec_keys[k] == key) return m->spec_lex[k];
  if (m->n_spec == m->cap_spec) {
    m->cap_spec = m->cap_spec ? m->cap_spec * 2 : 8;
    m->spec_keys = aici_realloc(m->spec_keys, m->cap_spec * 4);
    m->spec_lex = aici_realloc(m->spec_lex, m->cap_spec * 4);
  }
  if (m->n_ls == m->cap_ls) { m->cap_ls *= 2; m->ls = aici_realloc(m->ls, m->cap_ls * sizeof(lstate_t)); }
  if (m->n_pairs + m->g->n_terms > m->cap_pairs) {
    while (m->n_pairs + m->g->n_terms > m->cap_pairs) m->cap_pairs *= 2;
    m->pairs = aici_realloc(m->pairs, m->cap_pairs * 4);
  }
  uint32_t id = m->n_ls++;
  lstate_t *s = &m->ls[id];
  s->off = s->acc_off = m->n_pairs, s->n = 0, s->n_acc = 0, s->forced = s->stop = false, s->eager = -1;
  s->row = aici_calloc(256, 4);       /* no byte continues it */
  for (uint32_t t = 0; t < m->g->n_terms; t++) {
    const gr_term_t *x = &m->g->terms[t];
    bool in = key & 0x80000000u   ? x->token >= 0 && term_has(x, key & 0x7FFFFFFFu)
              : key & 0x40000000u ? t == (key & 0x3FFFFFFFu)
                                  : x->token >= 0 && t + 1 == key;
    if (in) { m->pairs[m->n_pairs++] = t; s->n_acc++; }
  }
  m->spec_keys[m->n_spec] = key;
  m->spec_lex[m->n_spec++] = id;
  return id;
}

/* From position p, a special token scanned through fake state `fake`: the current lexeme ends
 * first (if it has bytes). */
bool gm_special_step(gr_matcher_t *m, pos_t *p, uint32_t fake) {
  goto_pos(m, *p);
  m->tok_start = true;                 /* a special token is a token of its own */
  bool ended = p->at_start || (m->ls[p->lex].n_acc && gm_emit(m, p->lex));
  m->tok_start = false;
  if (!ended) return false;
  if (!m->ls[fake].n_acc || !gm_scan(m, fake) || m->overflow) { m->overflow = false; return false; }
  p->n_sets = m->n_sets;
  p->lex = m->sets[m->n_sets - 1].lstart;
  p->at_start = true;
  return true;
}
