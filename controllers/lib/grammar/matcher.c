/* matcher.c - the grammar's matcher: an Earley parser over lexemes, a lexer DFA built lazily
 * over the terminals each Earley set allows, and masks by one walk of the token trie.
 *
 * Parser state: a stack of Earley sets, one per lexeme scanned (set 0: before any). Lexer
 * state: an interned list of (terminal, SDK regex state) pairs, live terminals only; state 0 is
 * dead. A byte that the current lexeme cannot take ends it when the lexer state accepts (the
 * longest match, as llguidance's lexer does): the accepted terminals are scanned into a new set,
 * and the byte starts the next lexeme. A lexeme may be empty (a terminal that matches ""), at most
 * MAX_EMPTY in a row. During a mask walk, sets are built once per (parent set, lexer state) and
 * kept while the walk stays below them (`prov`), so the many tokens that end a lexeme the same
 * way share one set; and each set built is also kept by (its parent's id, lexer state) (the scan
 * cache), so a later walk that ends the same lexeme on the same set copies it back.
 */
#include "grammar.h"

/* -DGR_STATS: each mask logs its work counters (profiling; "ST lp=... wn=...") */
#ifdef GR_STATS
static struct { uint32_t dense_or, list_toks, unions, memo_hits, scan_cached, lexmiss, lexnew, lp, lp_nodes, runs, walk_nodes, walk_steps, scans, scan_reuse, items, slices; } st;
#define ST(x) (st.x++)
#define STN(x, n) (st.x += (n))
#else
#define ST(x)
#define STN(x, n)
#endif
#define MAX_EMPTY 4u                   /* empty lexemes in a row before a byte */
#define MAX_ITEMS (1u << 20)           /* Earley items alive at once (12 MiB): more fails the text */

typedef struct { uint32_t prod, dot, origin; } item_t;
/* id: what the set holds, as the chain of scans that built it from set 0 (1), so that (the
 * parent's id, lexer state) names a set's content exactly (the scan cache below) */
typedef struct { uint32_t start; uint32_t lstart; int32_t prov_lex; uint32_t prov_parent; uint32_t id; bool accepting; } eset_t;
typedef struct scached scached_t;
typedef struct { uint32_t off, n, acc_off, n_acc; int32_t *row; bool forced, stop; int8_t eager; } lstate_t;

struct gr_matcher {
  gr_grammar_t *g;
  item_t *items;
  uint32_t n_items, cap_items;
  eset_t *sets;
  uint32_t n_sets, valid, cap_sets;    /* logical top; physically intact sets (walk reuse) */
  uint32_t *ht, *ht_stamp, ht_cap, gen;/* item dedup for the set being built */
  /* scan cache: (parent set id, lexer state) -> the set built, or none (no item advanced) */
  scached_t *sc;
  uint32_t n_sc, cap_sc, *sc_tab, sc_tab_cap, next_id;
  item_t *sc_items;
  uint32_t n_sc_items, cap_sc_items;
  /* lexer */
  lstate_t *ls;
  uint32_t n_ls, cap_ls;
  uint32_t *pairs, n_pairs, cap_pairs; /* (term, regex state) lists; accepting terms after them */
  uint32_t *lht, lht_cap;              /* lexer-state intern table: ids, 0 = empty */
  uint32_t tw;                         /* words of a terminal bitset */
  uint32_t *starts, n_starts, cap_starts;  /* start states: [state, bitset...] records */
  uint32_t *scratch;                   /* a terminal bitset */
  uint8_t bcls[256];                   /* byte classes of all terminals together: bytes of one class */
  uint8_t cls_bytes[256];              /* lead every lexer state to the same state; members of */
  uint16_t cls_off[257];               /* class c: cls_bytes[cls_off[c] .. cls_off[c + 1]) */
  uint32_t n_cls;
  uint32_t *tmp_pairs, cap_tmp;
  struct parts *parts;                 /* the cached lexer-only parts of masks */
  uint32_t *spec_keys, *spec_lex, n_spec, cap_spec;   /* special-token scans: fake lexer states */
  bool tok_start;                      /* the byte being stepped is a token's first (stop lexemes) */
  /* position */
  uint32_t n_tok, n_byte;              /* tokens and bytes fed (max_tokens lexemes) */
  uint32_t row_byte, row_tok;          /* llguidance's start byte of the current row, its token */
  uint32_t lex;
  bool at_start;
  bool overflow;
};

/* ---- lexer states ------------------------------------------------------------------------ */
static uint32_t hash_pairs(const uint32_t *p, uint32_t n) {
  uint32_t h = 2166136261u;
  for (uint32_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h ? h : 1;
}

static void lht_grow(gr_matcher_t *m);

/* The lexer state for pairs p[0..2n) (sorted by terminal), interned. */
static uint32_t lex_intern(gr_matcher_t *m, const uint32_t *p, uint32_t n) {
  if (!n) return 0;
  uint32_t h = hash_pairs(p, 2 * n);
  if ((m->n_ls + 1) * 2 > m->lht_cap) lht_grow(m);
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

static void lht_grow(gr_matcher_t *m) {
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
static const int32_t *lex_row(gr_matcher_t *m, uint32_t id) {
  lstate_t *s = &m->ls[id];
  if (!s->row) {
    s->row = aici_malloc(256 * 4);
    for (int k = 0; k < 256; k++) s->row[k] = s->forced ? 0 : -1;
  }
  return s->row;
}

static uint32_t lex_next(gr_matcher_t *m, uint32_t id, uint8_t b) {
  lex_row(m, id);
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
  uint32_t id2 = lex_intern(m, m->tmp_pairs, n);
  int32_t *row = m->ls[id].row;        /* (ls may have moved): every byte of b's class */
  for (uint32_t k = m->cls_off[m->bcls[b]], e = m->cls_off[m->bcls[b] + 1]; k < e; k++) row[m->cls_bytes[k]] = (int32_t)id2;
  return id2;
}

/* The lexer's start state for terminal bitset `bits` (interned per distinct set). */
static uint32_t lex_start(gr_matcher_t *m, const uint32_t *bits) {
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
  uint32_t id = lex_intern(m, m->tmp_pairs, n);
  if (m->n_starts + rec > m->cap_starts) {
    m->cap_starts = (m->n_starts + rec) * 2;
    m->starts = aici_realloc(m->starts, m->cap_starts * 4);
  }
  m->starts[m->n_starts] = id;
  __builtin_memcpy(m->starts + m->n_starts + 1, bits, 4 * m->tw);
  m->n_starts += rec;
  return id;
}

/* ---- Earley sets ------------------------------------------------------------------------- */
static uint32_t set_end(const gr_matcher_t *m, uint32_t k) {
  return k + 1 < m->valid ? m->sets[k + 1].start : m->n_items;
}

static void ht_reset(gr_matcher_t *m) {
  if (++m->gen == 0) {
    __builtin_memset(m->ht_stamp, 0, m->ht_cap * 4);
    m->gen = 1;
  }
}

static void add_item(gr_matcher_t *m, uint32_t prod, uint32_t dot, uint32_t origin, uint32_t set_start) {
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
static void closure(gr_matcher_t *m, uint32_t k, uint32_t start) {
  gr_grammar_t *g = m->g;
  for (uint32_t w = start; w < m->n_items; w++) {
    item_t it = m->items[w];
    gr_prod_t *p = &g->prods[it.prod];
    if (it.dot < p->n) {
      uint32_t sym = p->syms[it.dot];
      if (!(sym & GR_NT)) continue;
      uint32_t nt = sym & ~GR_NT;
      for (uint32_t q = g->nt_first[nt], e = q + g->nt_count[nt]; q < e; q++) add_item(m, q, 0, k, start);
      if (g->nullable[nt]) add_item(m, it.prod, it.dot + 1, it.origin, start);
    } else if (it.origin != k) {
      uint32_t want = p->lhs | GR_NT;
      uint32_t os = m->sets[it.origin].start, oe = m->sets[it.origin + 1].start;
      for (uint32_t j = os; j < oe; j++) {
        item_t o = m->items[j];
        gr_prod_t *op = &g->prods[o.prod];
        if (o.dot < op->n && op->syms[o.dot] == want) add_item(m, o.prod, o.dot + 1, o.origin, start);
      }
    }
  }
}

/* The set's derived fields: allowed terminals -> lexer start state; accepting. */
static void set_derive(gr_matcher_t *m, uint32_t k) {
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
  m->sets[k].lstart = lex_start(m, m->scratch);
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

/* The set just built at the top (ok) or the failed scan (!ok) into entry c: its items copied. */
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

/* scan() from a cached entry: the same state as building it. */
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
static bool scan(gr_matcher_t *m, uint32_t lex) {
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

/* scan() without the caches. */
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
  ht_reset(m);
  for (uint32_t w = m->sets[k].start, e = start; w < e; w++) {
    item_t it = m->items[w];
    gr_prod_t *p = &g->prods[it.prod];
    if (it.dot >= p->n || (p->syms[it.dot] & GR_NT)) continue;
    uint32_t s = p->syms[it.dot];
    for (uint32_t a = 0; a < n_acc; a++)
      if (acc[a] == s) { add_item(m, it.prod, it.dot + 1, it.origin, start); break; }
  }
  if (m->n_items == start) return false;
  m->n_sets = j + 1;
  m->valid = j + 1;
  /* completion reads sets[origin + 1].start: the top set's end must read n_items */
  closure(m, j, start);
  if (m->overflow) {                   /* a partial set is never kept: the caller sees a dead end */
    m->n_sets = m->valid = j;
    m->n_items = start;
    return false;
  }
  m->sets[j].prov_lex = (int32_t)lex;
  m->sets[j].prov_parent = k;
  m->sets[j].id = ++m->next_id;
  set_derive(m, j);
  return true;
}

/* ---- stepping ---------------------------------------------------------------------------- */
typedef struct { uint32_t n_sets, lex; bool at_start; } pos_t;

static void goto_pos(gr_matcher_t *m, pos_t p) { m->n_sets = p.n_sets; }

/* End the current lexeme (lexer state `lex`, accepting): skip it when the %ignore terminal
 * matches it (that wins over grammar terminals matching the same text, as in llguidance), else
 * scan it. */
static bool emit(gr_matcher_t *m, uint32_t lex) {
  if (m->ls[lex].stop && !m->tok_start) return false;   /* a stop lexeme ends with its token */
  for (uint32_t a = 0; a < m->ls[lex].n_acc; a++)
    if ((int32_t)m->pairs[m->ls[lex].acc_off + a] == m->g->skip) return true;   /* skipped: same set */
  return scan(m, lex);
}

/* One byte from position p; false when dead. On success p is the new position (the parser's
 * top may have moved up). */
static bool step(gr_matcher_t *m, pos_t *p, uint8_t b) {
  goto_pos(m, *p);
  uint32_t lex = p->lex, ns = lex_next(m, lex, b);
  if (ns) { p->lex = ns; p->at_start = false; return true; }
  for (uint32_t k = 0; k < MAX_EMPTY; k++) {
    if (!m->ls[lex].n_acc) return false;
    if (!emit(m, lex)) return false;
    lex = m->sets[m->n_sets - 1].lstart;
    ns = lex_next(m, lex, b);
    if (ns) { p->n_sets = m->n_sets; p->lex = ns; p->at_start = false; return true; }
  }
  return false;
}

static bool pos_accepting_at(gr_matcher_t *m, pos_t p);
static bool pos_accepting(gr_matcher_t *m, pos_t p) {
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
    if (!m->ls[lex].n_acc || !emit(m, lex)) return false;
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
static uint32_t spec_state(gr_matcher_t *m, uint32_t key) {
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
static bool special_step(gr_matcher_t *m, pos_t *p, uint32_t fake) {
  goto_pos(m, *p);
  m->tok_start = true;                 /* a special token is a token of its own */
  bool ended = p->at_start || (m->ls[p->lex].n_acc && emit(m, p->lex));
  m->tok_start = false;
  if (!ended) return false;
  if (!m->ls[fake].n_acc || !scan(m, fake) || m->overflow) { m->overflow = false; return false; }
  p->n_sets = m->n_sets;
  p->lex = m->sets[m->n_sets - 1].lstart;
  p->at_start = true;
  return true;
}

/* ---- public API -------------------------------------------------------------------------- */
/* The byte classes of all terminals together: the common refinement of each regex's classes
 * (two bytes share a class iff they share one in every terminal's regex). */
static void byte_classes(gr_matcher_t *m) {
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

gr_matcher_t *gr_matcher_new(gr_grammar_t *g) {
  gr_matcher_t *m = aici_calloc(1, sizeof(gr_matcher_t));
  m->g = g;
  m->cap_items = 1024;
  m->items = aici_malloc(m->cap_items * sizeof(item_t));
  m->cap_sets = 64;
  m->sets = aici_malloc(m->cap_sets * sizeof(eset_t));
  m->ht_cap = 256;
  m->ht = aici_malloc(m->ht_cap * 4);
  m->ht_stamp = aici_calloc(m->ht_cap, 4);
  m->cap_ls = 64;
  m->ls = aici_calloc(m->cap_ls, sizeof(lstate_t));
  m->n_ls = 1;                         /* 0: dead */
  m->ls[0].row = aici_calloc(256, 4);
  m->cap_pairs = 1024;
  m->pairs = aici_malloc(m->cap_pairs * 4);
  m->tw = (g->n_terms + 31) / 32 + 1;
  m->scratch = aici_calloc(m->tw, 4);
  byte_classes(m);
  lht_grow(m);
  /* set 0 */
  m->sets[0].start = 0;
  m->sets[1].start = 0;
  m->sets[0].prov_lex = -1;
  m->sets[0].id = m->next_id = 1;
  m->n_sets = m->valid = 1;
  ht_reset(m);
  add_item(m, g->start_prod, 0, 0, 0);
  closure(m, 0, 0);
  set_derive(m, 0);
  m->lex = m->sets[0].lstart;
  m->at_start = true;
  return m;
}

static pos_t cur(const gr_matcher_t *m) { return (pos_t){m->n_sets, m->lex, m->at_start}; }

/* ---- max_tokens lexemes ------------------------------------------------------------------
 * As llguidance's parser (earley/parser.rs, apply_token): each lexeme's row has a start byte and
 * the token holding it (row_tok). A lexeme that no byte can extend, or a lazy one once it
 * matches, ends at its last byte, and the next row starts at the byte after it (at byte 0 when
 * it ended at the text's first byte); other lexemes end at the byte that cannot extend them,
 * which starts the next row. After a token in whose last byte no row began, the terminals of the
 * lexer state whose max_tokens is at most the tokens from row_tok to this one are dropped from
 * it; if none is left, the lexeme ends there as the first of them, matched or not (llguidance's
 * force_lexeme_end), and the next row starts one byte past the token's end. */
static bool lex_eager(gr_matcher_t *m, uint32_t id) {   /* ends at its last byte */
  lstate_t *s = &m->ls[id];
  if (s->eager < 0) {
    bool ext = false;
    for (uint32_t c = 0; c < m->n_cls && !ext; c++) ext = lex_next(m, id, m->cls_bytes[m->cls_off[c]]) != 0;
    s = &m->ls[id];
    s->eager = s->n_acc && (s->forced || !ext);
  }
  return s->eager;
}

/* false: the lexeme was not cut; else *p is after it (at the start of the next one). */
static bool limit_tokens(gr_matcher_t *m, pos_t *p, uint32_t span) {
  lstate_t *s = &m->ls[p->lex];
  uint32_t n = s->n, off = s->off, keep = 0;
  if (m->cap_tmp < 2 * n) { m->cap_tmp = 2 * n; m->tmp_pairs = aici_realloc(m->tmp_pairs, m->cap_tmp * 4); }
  for (uint32_t k = 0; k < n; k++) {
    uint32_t t = m->pairs[off + 2 * k], mt = m->g->terms[t].max_tokens;
    if (mt && mt <= span) continue;
    m->tmp_pairs[2 * keep] = t, m->tmp_pairs[2 * keep + 1] = m->pairs[off + 2 * k + 1];
    keep++;
  }
  if (keep == n) return false;
  if (keep) { p->lex = lex_intern(m, m->tmp_pairs, keep); return false; }
  uint32_t fake = spec_state(m, 0x40000000u | m->pairs[off]);   /* pairs are sorted by terminal */
  goto_pos(m, *p);
  if (!scan(m, fake) || m->overflow) { m->overflow = false; goto_pos(m, *p); return false; }
  p->n_sets = m->n_sets, p->lex = m->sets[m->n_sets - 1].lstart, p->at_start = true;
  return true;
}

bool gr_advance(gr_matcher_t *m, const uint8_t *bytes, uint32_t n) {
  pos_t p = cur(m), save = p;
  uint32_t tok = m->n_tok, b0 = m->n_byte, row_byte = m->row_byte, row_tok = m->row_tok;
  bool counted = m->g->has_max_tokens, last_row = false;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t prev = p.lex;
    m->tok_start = i == 0;
    if (!step(m, &p, bytes[i]) || m->overflow) { goto_pos(m, save); m->overflow = false; m->tok_start = false; return false; }
    if (!counted) continue;
    last_row = false;
    if (!lex_next(m, prev, bytes[i])) {  /* this byte began a new lexeme */
      uint32_t x = b0 + i;
      if (lex_eager(m, prev)) row_byte = x == 1 ? 0 : x;   /* its row began at the byte before */
      else row_byte = x, last_row = true;
    }
  }
  m->tok_start = false;
  if (counted && n) {
    if (row_byte >= b0) row_tok = tok;
    if (!last_row && !lex_eager(m, p.lex) && limit_tokens(m, &p, tok + 1 - row_tok))
      row_byte = b0 + n + 1, row_tok = tok;
  }
  m->n_sets = p.n_sets, m->lex = p.lex, m->at_start = p.at_start;
  m->n_tok = tok + 1, m->n_byte = b0 + n, m->row_byte = row_byte, m->row_tok = row_tok;
  return true;
}

bool gr_advance_token(gr_matcher_t *m, aici_token_t t) {
  pos_t p = cur(m), save = p;
  if (t >= 0x80000000u || !special_step(m, &p, spec_state(m, 0x80000000u | t))) { goto_pos(m, save); return false; }
  m->n_sets = p.n_sets, m->lex = p.lex, m->at_start = p.at_start;
  m->row_byte = m->n_byte, m->row_tok = m->n_tok++;   /* the next lexeme's row */
  return true;
}

bool gr_accepting(gr_matcher_t *m) {
  pos_t c = cur(m);
  bool a = pos_accepting(m, c);
  goto_pos(m, c);
  return a;
}

gr_mark_t gr_save(const gr_matcher_t *m) {
  return (gr_mark_t){m->n_sets, m->lex, m->at_start, m->n_tok, m->n_byte, m->row_byte, m->row_tok};
}
void gr_restore(gr_matcher_t *m, gr_mark_t k) {
  m->n_sets = k.n_sets, m->lex = k.lex, m->at_start = k.at_start != 0;   /* sets below stay intact */
  m->n_tok = k.n_tok, m->n_byte = k.n_byte, m->row_byte = k.row_byte, m->row_tok = k.row_tok;
}

/* ---- masks ------------------------------------------------------------------------------
 * A mask is built from *parts*. The part of (lexer state L, trie subtree T) is what the lexer
 * alone decides about T's tokens from L: the tokens that stay inside the current lexeme, and the
 * *emission edges*, nodes of T whose byte the lexeme cannot take where the lexer state before it
 * accepts (a lexeme ends there). Parts depend on no parser state, so they are cached: the root
 * part per lexer state (with the SDK's slices), and below each edge the part of the subtree
 * that the next lexeme starts (per lexer state after the edge's byte and node), so that a
 * token crossing a boundary costs a parser step per distinct (lexer state, byte) group, not a
 * walk of its subtree. Applying a part: its tokens, then per edge group one parser step (most
 * groups die at once: the byte starts no lexeme the parser allows), and for each live edge the
 * part below it, recursively. */
#define PART_ROOTS_MAX 256u            /* root parts cached (more: plain walks) */
#ifndef SUB_MIN_NODES
#define SUB_MIN_NODES 48u              /* subtrees smaller than this are walked, not cached */
#endif
#define PART_BYTES_MAX (8u << 20)      /* memory all parts may hold (more: plain walks) */

typedef struct { uint32_t key, child; } edge_t;   /* key: EDGE_TOP | lexer state << 8 | byte */
typedef struct { aici_tokset_t *dense; uint32_t *toks, n_toks; } toks_t;   /* a set (big ones) or a list */
#define EDGE_TOP 0x80000000u           /* the edge's byte starts a token (lexer states < 2^23) */
typedef struct part {
  uint32_t lex, node;                  /* key: lexer state, subtree root (0: the whole trie) */
  const aici_trie_t *base;             /* key: the trie `node` indexes */
  const aici_trie_t *walked;           /* the trie the edges index (root part: maybe a slice's rest) */
  const aici_slice_t *slice;           /* root parts: the slice whose tokens are inside wholesale */
  toks_t own;                          /* (other) tokens inside the lexeme */
  edge_t *edges;
  uint32_t n_edges;
  bool ends;                           /* a root part whose lexeme no byte extends (it accepts): its
                                        * edges are all the trie's root children (parts_t.top) */
} part_t;

typedef struct { uint32_t ch, lex; const part_t *sub; } kid_t;   /* sub NULL: walk ch's subtree */
/* a run's union (see the applications of parts) */
typedef struct tunion {
  const part_t *c;                     /* key: the part, its run's first edge, the start state */
  uint32_t run, lex0;
  toks_t toks;                         /* the live edges' tokens and their parts' own tokens */
  kid_t *kids;                         /* the live edges with a subtree below */
  uint32_t n_kids;
  bool temp;                           /* not kept (memory budget spent) */
} tunion_t;

typedef struct parts {
  part_t **tab;                        /* open addressing on (lex, node, base) */
  uint32_t cap, n, n_roots;
  uint32_t bytes;                      /* held by all parts */
  uint32_t *tmp, cap_tmp;              /* token list being built */
  edge_t *etmp;
  uint32_t cap_etmp;
  uint32_t *lstack, cap_lstack;        /* lex_walk's stack */
  edge_t *top;                         /* the root children of top_trie, as edges (key: EDGE_TOP | byte) */
  uint32_t n_top;
  const aici_trie_t *top_trie;
  /* applications of parts (below) */
  struct memo *memo;
  uint32_t n_memo, cap_memo, *mtab, mtab_cap;
  uint32_t *pool, n_pool, cap_pool;    /* the entries' lists */
  uint32_t *rec, n_rec, cap_rec;       /* lists being recorded (nested: one per open call) */
  uint32_t n_dense;                    /* entries with a dense replay */
  /* unions of edge runs (below) */
  struct tunion **utab;
  uint32_t utab_cap, n_unions;
  uint32_t *utmp, n_utmp, cap_utmp;    /* a union being built: its edges' tokens, its kids */
  kid_t *ukids;
  uint32_t cap_ukids;
} parts_t;

static uint32_t part_hash(uint32_t lex, uint32_t node, const aici_trie_t *base) {
  uint32_t h = lex * 0x9E3779B1u ^ node * 0x85EBCA77u ^ (uint32_t)(uintptr_t)base * 0xC2B2AE3Du;
  return h ^ (h >> 15);
}

static part_t *part_find(parts_t *P, uint32_t lex, uint32_t node, const aici_trie_t *base) {
  if (!P->cap) return 0;
  for (uint32_t i = part_hash(lex, node, base) & (P->cap - 1);; i = (i + 1) & (P->cap - 1)) {
    part_t *c = P->tab[i];
    if (!c) return 0;
    if (c->lex == lex && c->node == node && c->base == base) return c;
  }
}

static void part_insert(parts_t *P, part_t *c) {
  if ((P->n + 1) * 2 > P->cap) {
    uint32_t cap = P->cap ? P->cap * 2 : 256;
    part_t **t = aici_calloc(cap, sizeof(part_t *));
    for (uint32_t k = 0; k < P->cap; k++)
      if (P->tab[k]) {
        uint32_t i = part_hash(P->tab[k]->lex, P->tab[k]->node, P->tab[k]->base) & (cap - 1);
        while (t[i]) i = (i + 1) & (cap - 1);
        t[i] = P->tab[k];
      }
    aici_free(P->tab);
    P->tab = t, P->cap = cap;
    P->bytes += cap * (uint32_t)sizeof(part_t *) / 2;
  }
  uint32_t i = part_hash(c->lex, c->node, c->base) & (P->cap - 1);
  while (P->tab[i]) i = (i + 1) & (P->cap - 1);
  P->tab[i] = c;
  P->n++;
}

#define COVER_STATES 64u               /* lexer states a slice check follows before giving up */

/* The largest byte set C such that every string over C keeps `lex` alive (false: none worth a
 * slice, or too many states to check). Then the tokens whose bytes lie in C are inside the
 * lexeme wholesale (the SDK's slice), and only the other tokens (its rest trie) are walked. */
static bool lex_cover(gr_matcher_t *m, uint32_t lex, uint32_t *cover) {
  /* over byte classes: the bytes of a class lead every lexer state to the same state */
  uint32_t list[COVER_STATES], n = 1, nc = m->n_cls;
  uint8_t in[256];
  list[0] = lex;
  __builtin_memset(in, 1, nc);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t st = list[i];
    for (uint32_t c = 0; c < nc; c++) {
      if (!in[c]) continue;
      uint32_t ns = lex_next(m, st, m->cls_bytes[m->cls_off[c]]);
      if (!ns) { in[c] = 0; continue; }
      bool seen = false;
      for (uint32_t k = 0; k < n && !seen; k++) seen = list[k] == ns;
      if (!seen) {
        if (n == COVER_STATES) return false;
        list[n++] = ns;
      }
    }
  }
  uint32_t count = 0;
  for (int w = 0; w < 8; w++) cover[w] = 0;
  for (uint32_t c = 0; c < nc; c++)
    if (in[c])
      for (uint32_t k = m->cls_off[c], e = m->cls_off[c + 1]; k < e; k++, count++)
        cover[m->cls_bytes[k] >> 5] |= 1u << (m->cls_bytes[k] & 31);
  return count >= 8;
}

/* Slices made once per tokenizer (gr_prepare_tokenizer, in the init: every request starts with
 * them from the snapshot) for the byte sets identifiers live in. A slice of any C' within a
 * lexer state's cover is exact too (every string over C' is one over C): the largest ready one
 * is taken, and a slice for the exact cover is built (per instance, a pass over the trie) only
 * when none fits. */
static const char *const STD_SLICES[] = {"a-z", "A-Za-z", "0-9A-Z_a-z"};
#define N_STD (sizeof STD_SLICES / sizeof STD_SLICES[0])
static const aici_slice_t *std_slices[N_STD];
static const aici_trie_t *std_trie;

void gr_prepare_tokenizer(const aici_trie_t *trie) {
  if (!trie || std_trie == trie) return;
  std_trie = trie;
  for (uint32_t k = 0; k < N_STD; k++) {
    uint32_t bytes[8] = {0};
    for (const char *r = STD_SLICES[k]; *r;) {
      uint8_t lo = (uint8_t)*r, hi = lo;
      if (r[1] == '-' && r[2]) hi = (uint8_t)r[2], r += 3;
      else r++;
      for (uint32_t b = lo; b <= hi; b++) bytes[b >> 5] |= 1u << (b & 31);
    }
    std_slices[k] = aici_trie_slice(trie, bytes);
  }
}

/* Whether every string over byte set `bytes` keeps `lex` alive (false also past COVER_STATES). */
static bool lex_covers(gr_matcher_t *m, uint32_t lex, const uint32_t *bytes) {
  uint32_t list[COVER_STATES], n = 1, nc = 0;
  uint8_t reps[256];                   /* one byte per class that meets `bytes` */
  for (uint32_t c = 0; c < m->n_cls; c++)
    for (uint32_t k = m->cls_off[c], e = m->cls_off[c + 1]; k < e; k++)
      if ((bytes[m->cls_bytes[k] >> 5] >> (m->cls_bytes[k] & 31)) & 1) { reps[nc++] = m->cls_bytes[k]; break; }
  list[0] = lex;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t c = 0; c < nc; c++) {
      uint32_t ns = lex_next(m, list[i], reps[c]);
      if (!ns) return false;
      bool seen = false;
      for (uint32_t k = 0; k < n && !seen; k++) seen = list[k] == ns;
      if (!seen) {
        if (n == COVER_STATES) return false;
        list[n++] = ns;
      }
    }
  return true;
}

/* The largest ready slice whose byte set keeps `lex` alive (NULL: none). lex_cover's greedy set
 * can miss it (a state where only digits live, NUMBER's, shrinks it to [0-9] though [a-z] keeps
 * NAME's alive), so each ready set is checked on its own first. */
static const aici_slice_t *std_slice(gr_matcher_t *m, const aici_trie_t *trie, uint32_t lex) {
  const aici_slice_t *best = 0;
  if (std_trie != trie) return 0;
  for (uint32_t k = 0; k < N_STD; k++) {
    const aici_slice_t *sl = std_slices[k];
    if (sl && (!best || sl->n_tokens > best->n_tokens) && lex_covers(m, lex, sl->bytes)) best = sl;
  }
  return best;
}

static const aici_slice_t *cover_slice(const aici_trie_t *trie, const uint32_t *cover) {
  const aici_slice_t *best = 0;
  if (std_trie == trie)
    for (uint32_t k = 0; k < N_STD; k++) {
      const aici_slice_t *sl = std_slices[k];
      bool sub = sl != 0;
      for (int w = 0; w < 8 && sub; w++) sub = !(sl->bytes[w] & ~cover[w]);
      if (sub && (!best || sl->n_tokens > best->n_tokens)) best = sl;
    }
  return best ? best : aici_trie_slice(trie, cover);
}

static void rec_push(parts_t *P, uint32_t v);

/* The general walk over nodes [p, end) of the trie, the parent's position being `top`; with
 * `rec`, each token it allows is also recorded (rec_push). */
static void walk(gr_matcher_t *m, const aici_trie_t *trie, uint32_t p, uint32_t end, pos_t top, uint32_t *mask,
                 uint32_t vocab, pos_t *stack, parts_t *rec) {
  const aici_trie_node_t *nodes = trie->nodes;
  bool top_level = p == 1;             /* the whole trie: its root's children start tokens */
  uint32_t sp = 1;
  stack[0] = top;
  while (p < end) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8;
    pos_t q = stack[sp - 1];
    ST(walk_nodes);
    const int32_t *row = m->ls[q.lex].row;
    int32_t ns = row ? row[w0 & 255] : -1;
    bool live;
    if (ns > 0) {                      /* the lexeme goes on: no parser work */
      q.lex = (uint32_t)ns, q.at_start = false;
      live = true;
    } else {
      ST(walk_steps);
      m->tok_start = top_level && sp == 1;
      live = step(m, &q, (uint8_t)(w0 & 255)) && !m->overflow;
      m->overflow = m->tok_start = false;
    }
    if (live && tok < vocab) {
      mask[tok >> 5] |= 1u << (tok & 31);
      if (rec) rec_push(rec, tok);
    }
    if (live && (w1 >> 10) > 1) {
      stack[sp++] = q;
      p++;
    } else {
      p += w1 >> 10;
      sp -= w1 & 1023;
    }
  }
}

static void sort_edges(edge_t *e, uint32_t n) {   /* shellsort by key (stable enough: keys only) */
  static const uint32_t gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
  for (uint32_t g = 0; g < 8; g++)
    for (uint32_t i = gaps[g]; i < n; i++) {
      edge_t t = e[i];
      uint32_t j = i;
      for (; j >= gaps[g] && e[j - gaps[g]].key > t.key; j -= gaps[g]) e[j] = e[j - gaps[g]];
      e[j] = t;
    }
}

/* The lexer-only walk of nodes [p, end) of `t` from lexer state `lex`: tokens inside the lexeme
 * into the list P->tmp (count *n_toks), or, once they outnumber a set's words, into the new set
 * *grown (else NULL); edges into P->etmp (*n_edges). */
static void lex_walk(gr_matcher_t *m, const aici_trie_t *t, uint32_t p, uint32_t end, uint32_t lex,
                     aici_tokset_t **grown, uint32_t vocab, uint32_t *n_toks, uint32_t *n_edges) {
  bool top = p == 1;                   /* a root part: its root's children start tokens (EDGE_TOP) */
  parts_t *P = m->parts;
  uint32_t *mask = 0, nw = (vocab + 31) / 32;
  *grown = 0;
  const aici_trie_node_t *nodes = t->nodes;
  if (P->cap_lstack < t->max_depth + 2) {
    P->cap_lstack = t->max_depth + 2;
    P->lstack = aici_realloc(P->lstack, P->cap_lstack * 4);
  }
  /* the top's state, its row and whether it accepts stay in locals: they change on a push or a
   * pop only, not between siblings */
  uint32_t *stack = P->lstack, sp = 1, nt = 0, ne = 0, from = lex;
  const int32_t *row = lex_row(m, from);
  bool acc = m->ls[from].n_acc != 0;
  stack[0] = lex;
  while (p < end) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8;
    ST(lp_nodes);
    int32_t r = row[w0 & 255];
    uint32_t ns = r >= 0 ? (uint32_t)r : lex_next(m, from, (uint8_t)(w0 & 255));
    if (ns) {
      if (tok < vocab) {
        if (mask) mask[tok >> 5] |= 1u << (tok & 31);
        else if (nt == nw) {           /* a set is smaller than the list from here on */
          *grown = aici_tokset_new();
          mask = (*grown)->words;
          for (uint32_t k = 0; k < nt; k++) mask[P->tmp[k] >> 5] |= 1u << (P->tmp[k] & 31);
          mask[tok >> 5] |= 1u << (tok & 31);
        } else {
          if (nt == P->cap_tmp) P->cap_tmp = P->cap_tmp ? 2 * P->cap_tmp : 1024, P->tmp = aici_realloc(P->tmp, P->cap_tmp * 4);
          P->tmp[nt++] = tok;
        }
      }
      if ((w1 >> 10) > 1) {
        stack[sp++] = from = ns;
        row = lex_row(m, from);
        acc = m->ls[from].n_acc != 0;
        p++;
        continue;
      }
    } else if (acc) {
      if (ne == P->cap_etmp) P->cap_etmp = P->cap_etmp ? 2 * P->cap_etmp : 256, P->etmp = aici_realloc(P->etmp, P->cap_etmp * sizeof(edge_t));
      P->etmp[ne++] = (edge_t){(uint32_t)(sp == 1 && top) << 31 | from << 8 | (w0 & 255), p};
    }
    p += w1 >> 10;
    if (w1 & 1023) {
      sp -= w1 & 1023;
      if (p >= end) break;             /* the subtree's last node pops past its root */
      from = stack[sp - 1];
      row = m->ls[from].row;
      acc = m->ls[from].n_acc != 0;
    }
  }
  *n_toks = nt, *n_edges = ne;
}

static part_t *part_new(gr_matcher_t *m, uint32_t lex, uint32_t node, const aici_trie_t *base, const aici_trie_t *walked,
                        uint32_t n_edges) {
  parts_t *P = m->parts;
  part_t *c = aici_calloc(1, sizeof(part_t));
  c->lex = lex, c->node = node, c->base = base, c->walked = walked;
  sort_edges(P->etmp, n_edges);
  c->n_edges = n_edges;
  if (n_edges) {
    c->edges = aici_malloc(n_edges * sizeof(edge_t));
    __builtin_memcpy(c->edges, P->etmp, n_edges * sizeof(edge_t));
  }
  P->bytes += (uint32_t)sizeof(part_t) + n_edges * (uint32_t)sizeof(edge_t);
  part_insert(P, c);
  return c;
}

/* Keeps lex_walk's tokens in part c: its set, or its list P->tmp[0..nt). */
static void part_keep_toks(parts_t *P, part_t *c, uint32_t nt, aici_tokset_t *grown) {
  if (grown) {
    c->own.dense = grown;
    P->bytes += grown->n_words * 4;
  } else if (nt) {
    c->own.toks = aici_malloc(nt * 4);
    __builtin_memcpy(c->own.toks, P->tmp, nt * 4);
    c->own.n_toks = nt;
    P->bytes += nt * 4;
  }
}

/* Tokens t into mask (ORed). */
static void toks_or(const toks_t *t, uint32_t *mask) {
  if (t->dense) ST(dense_or);
  STN(list_toks, t->n_toks);
  if (t->dense) for (uint32_t w = 0, n = t->dense->n_words; w < n; w++) mask[w] |= t->dense->words[w];
  for (uint32_t k = 0; k < t->n_toks; k++) mask[t->toks[k] >> 5] |= 1u << (t->toks[k] & 31);
}

/* The root part of lexer state `lex` (NULL: too many cached). It refers to its slice (the SDK
 * keeps it) and holds only the other tokens, mostly a short list: a first visit costs no
 * vocabulary-sized copy or allocation. */
static part_t *root_part(gr_matcher_t *m, const aici_trie_t *trie, uint32_t lex) {
  parts_t *P = m->parts;
  part_t *c = part_find(P, lex, 0, trie);
  if (c || P->n_roots >= PART_ROOTS_MAX || P->bytes >= PART_BYTES_MAX) return c;
  ST(lp);
  /* every token starts the next lexeme: no walk, no edges (one trie per matcher has them: the
   * unions they share assume it) */
  if ((!P->top_trie || P->top_trie == trie) && lex_eager(m, lex)) {
    if (!P->top_trie) {
      /* more than 256 when a byte string has several ids (byte fallback: <0x41> and "A"), the
       * extra ids being leaf siblings with the same byte: counted first */
      uint32_t n = 0;
      for (uint32_t p = 1; p < trie->n_nodes; p += trie->nodes[p].w1 >> 10) n++;
      P->top = aici_malloc((n ? n : 1) * sizeof(edge_t));
      for (uint32_t p = 1; p < trie->n_nodes; p += trie->nodes[p].w1 >> 10)
        P->top[P->n_top++] = (edge_t){EDGE_TOP | (trie->nodes[p].w0 & 255), p};
      P->top_trie = trie;
    }
    c = part_new(m, lex, 0, trie, trie, 0);
    c->ends = true;
    P->n_roots++;
    return c;
  }
  uint32_t cover[8], nt, ne;
  const aici_trie_t *walked = trie;
  const aici_slice_t *sl = std_slice(m, trie, lex);
  if (!sl && lex_cover(m, lex, cover)) sl = cover_slice(trie, cover);
  if (sl) {                            /* the slice's tokens wholesale, then walk its rest trie */
    ST(slices);
    walked = &sl->rest;
  }
  aici_tokset_t *grown;
  lex_walk(m, walked, 1, walked->n_nodes, lex, &grown, trie->vocab, &nt, &ne);
  c = part_new(m, lex, 0, trie, walked, ne);
  c->slice = sl;
  part_keep_toks(P, c, nt, grown);
  P->n_roots++;
  return c;
}

/* The part below edge node `ch` of trie `t`, the next lexeme in lexer state `lex` (NULL: the
 * memory budget is spent; the caller walks). */
static part_t *sub_part(gr_matcher_t *m, const aici_trie_t *t, uint32_t ch, uint32_t lex, uint32_t vocab) {
  parts_t *P = m->parts;
  part_t *c = part_find(P, lex, ch, t);
  if (c || P->bytes >= PART_BYTES_MAX) return c;
  uint32_t nt, ne, size = t->nodes[ch].w1 >> 10;
  aici_tokset_t *grown;
  lex_walk(m, t, ch + 1, ch + size, lex, &grown, vocab, &nt, &ne);
  c = part_new(m, lex, ch, t, t, ne);
  part_keep_toks(P, c, nt, grown);
  return c;
}

/* ---- applications of parts -----------------------------------------------------------------
 * Applying part c at a position: per run of its edges of one lexer state F, the lexeme is ended
 * once (a scan), and the run's edges whose byte the next lexeme's start state S takes are live.
 * Which edges those are, their tokens and the own tokens of the parts below them depend on (c,
 * the run, S) only, not on the parser: they are kept as the run's *union* (its tokens as one set
 * or list, and the live children, each with its lexer state and part), so a later application
 * reads one union instead of a row lookup per edge and a token list per child. Only what lies
 * below the children (their own edges) is applied per position, recursively; the edges whose
 * byte S does not take but that an empty lexeme lets live (S accepting) are stepped per
 * position as before.
 *
 * What an application adds is a function of c and the position's top set (its id names the
 * whole stack, see the scan cache; c's lexer state is the position's), so it is recorded: the
 * unions and parts whose tokens it added, its own tokens, and the entries of the applications
 * below it. A later application of c on the same set (the next masks inside one lexeme: the
 * lexeme ends the same way below each edge) replays the entry: no parser steps, no trie. Entries
 * refer to unions and parts, which stay. Up to MEMO_POOL_MAX list words and MEMO_MAX entries;
 * past them, applications are computed as before. */
#define MEMO_MAX (1u << 17)
#define MEMO_POOL_MAX (1u << 19)       /* 2 MiB of lists */
#define MEMO_NONE UINT32_MAX
/* A list word: a token id (< 2^24), another entry (MEMO_CHILD | index), or a toks_t to OR in
 * (MEMO_TOKS | its address / 4: wasm32 addresses fit). */
#define MEMO_CHILD 0x80000000u
#define MEMO_TOKS 0x40000000u
#define MEMO_DENSE_MAX 64u             /* entries replayed from a set of their own (19 KiB each at 150k tokens) */
/* weight: the replay's writes (a list token 1, a set its words); dense: the whole replay as one
 * set, made at a hit once the weight is over two sets' words */
typedef struct memo { uint32_t set_id; const part_t *c; uint32_t off, n, weight; uint32_t *dense; } memo_t;


static uint32_t toks_weight(const toks_t *t, uint32_t n_words) { return t->dense ? n_words : t->n_toks; }

static uint32_t memo_hash(uint32_t set_id, const part_t *c) {
  uint32_t h = set_id * 0x9E3779B1u ^ (uint32_t)(uintptr_t)c * 0x85EBCA77u;
  return h ^ (h >> 15);
}

/* The entry of (set_id, c), or MEMO_NONE. */
static uint32_t memo_find(const parts_t *P, uint32_t set_id, const part_t *c) {
  if (!P->mtab_cap) return MEMO_NONE;
  for (uint32_t i = memo_hash(set_id, c) & (P->mtab_cap - 1);; i = (i + 1) & (P->mtab_cap - 1)) {
    uint32_t e = P->mtab[i];
    if (!e) return MEMO_NONE;
    if (P->memo[e - 1].set_id == set_id && P->memo[e - 1].c == c) return e - 1;
  }
}

static void rec_push(parts_t *P, uint32_t v) {
  if (P->n_rec == P->cap_rec) {
    P->cap_rec = P->cap_rec ? 2 * P->cap_rec : 1024;
    P->rec = aici_realloc(P->rec, P->cap_rec * 4);
  }
  P->rec[P->n_rec++] = v;
}

static uint32_t word_weight(const parts_t *P, uint32_t v, uint32_t n_words) {
  if (v & MEMO_CHILD) return P->memo[v & ~MEMO_CHILD].weight;
  if (v & MEMO_TOKS) return toks_weight((const toks_t *)(uintptr_t)((v & ~MEMO_TOKS) << 2), n_words);
  return 1;
}

/* Keeps the list rec[r0 ..) as the entry of (set_id, c); MEMO_NONE past the budget. */
static uint32_t memo_insert(parts_t *P, uint32_t set_id, const part_t *c, uint32_t r0, uint32_t n_words) {
  uint32_t n = P->n_rec - r0;
  if (P->n_memo >= MEMO_MAX || P->n_pool + n > MEMO_POOL_MAX) return MEMO_NONE;
  uint64_t w = 0;
  for (uint32_t k = r0; k < P->n_rec; k++) w += word_weight(P, P->rec[k], n_words);
  if ((P->n_memo + 1) * 2 > P->mtab_cap) {
    uint32_t cap = P->mtab_cap ? 2 * P->mtab_cap : 1024;
    aici_free(P->mtab);
    P->mtab = aici_calloc(cap, 4);
    P->mtab_cap = cap;
    for (uint32_t e = 0; e < P->n_memo; e++) {
      uint32_t i = memo_hash(P->memo[e].set_id, P->memo[e].c) & (cap - 1);
      while (P->mtab[i]) i = (i + 1) & (cap - 1);
      P->mtab[i] = e + 1;
    }
  }
  if (P->n_memo == P->cap_memo) {
    P->cap_memo = P->cap_memo ? 2 * P->cap_memo : 256;
    P->memo = aici_realloc(P->memo, P->cap_memo * sizeof(memo_t));
  }
  if (P->n_pool + n > P->cap_pool) {
    while (P->n_pool + n > P->cap_pool) P->cap_pool = P->cap_pool ? 2 * P->cap_pool : 4096;
    P->pool = aici_realloc(P->pool, P->cap_pool * 4);
  }
  __builtin_memcpy(P->pool + P->n_pool, P->rec + r0, n * 4);
  P->memo[P->n_memo] = (memo_t){set_id, c, P->n_pool, n, w > UINT32_MAX ? UINT32_MAX : (uint32_t)w, 0};
  P->n_pool += n;
  uint32_t i = memo_hash(set_id, c) & (P->mtab_cap - 1);
  while (P->mtab[i]) i = (i + 1) & (P->mtab_cap - 1);
  P->mtab[i] = P->n_memo + 1;
  return P->n_memo++;
}

/* Replays entry e into mask (nw words). */
static void memo_apply(const parts_t *P, uint32_t e, uint32_t *mask, uint32_t nw) {
  ST(memo_hits);
  const memo_t *x = &P->memo[e];
  if (x->dense) {
    for (uint32_t w = 0; w < nw; w++) mask[w] |= x->dense[w];
    return;
  }
  for (uint32_t k = x->off, end = x->off + x->n; k < end; k++) {
    uint32_t v = P->pool[k];
    if (v & MEMO_CHILD) memo_apply(P, v & ~MEMO_CHILD, mask, nw);
    else if (v & MEMO_TOKS) toks_or((const toks_t *)(uintptr_t)((v & ~MEMO_TOKS) << 2), mask);
    else mask[v >> 5] |= 1u << (v & 31);
  }
}

static uint32_t toks_word(const toks_t *t) { return MEMO_TOKS | (uint32_t)(uintptr_t)t >> 2; }

static uint32_t union_hash(const part_t *c, uint32_t run, uint32_t lex0) {
  uint32_t h = (uint32_t)(uintptr_t)c * 0x9E3779B1u ^ run * 0x85EBCA77u ^ lex0 * 0xC2B2AE3Du;
  return h ^ (h >> 15);
}

static void union_free(tunion_t *u) {
  if (u->toks.dense) aici_tokset_free(u->toks.dense);
  aici_free(u->toks.toks);
  aici_free(u->kids);
  aici_free(u);
}

/* The union of part c's run of edges [i, end) when the next lexeme starts in state lex0: kept,
 * or once the memory budget is spent, a `temp` one the caller frees after use. */
static tunion_t *run_union(gr_matcher_t *m, const part_t *c, const edge_t *edges, const aici_trie_t *walked, uint32_t i,
                           uint32_t end, uint32_t lex0, uint32_t vocab) {
  parts_t *P = m->parts;
  uint32_t h = union_hash(c, i, lex0), slot = 0;
  if (P->utab_cap)
    for (uint32_t k = h & (P->utab_cap - 1);; k = (k + 1) & (P->utab_cap - 1)) {
      tunion_t *u = P->utab[k];
      if (!u) { slot = k; break; }
      if (u->c == c && u->run == i && u->lex0 == lex0) return u;
    }
  ST(unions);
  const aici_trie_node_t *nodes = walked->nodes;
  uint32_t nw = (vocab + 31) / 32, nt = 0, nk = 0;
  uint64_t weight = 0;
  P->n_utmp = 0;
  /* the live edges: their tokens into utmp, their subtrees into ukids */
  for (uint32_t k = i; k < end; k++) {
    uint8_t b = (uint8_t)(edges[k].key & 255);
    const int32_t *row = m->ls[lex0].row;
    int32_t r = row ? row[b] : -1;
    uint32_t ns = r >= 0 ? (uint32_t)r : lex_next(m, lex0, b);
    if (!ns) continue;
    uint32_t ch = edges[k].child, tok = nodes[ch].w0 >> 8, size = nodes[ch].w1 >> 10;
    if (tok < vocab) {
      if (P->n_utmp == P->cap_utmp) P->cap_utmp = P->cap_utmp ? 2 * P->cap_utmp : 1024, P->utmp = aici_realloc(P->utmp, P->cap_utmp * 4);
      P->utmp[P->n_utmp++] = tok;
      nt++;
    }
    if (size <= 1) continue;
    const part_t *sub = size >= SUB_MIN_NODES ? sub_part(m, walked, ch, ns, vocab) : 0;
    if (nk == P->cap_ukids) P->cap_ukids = P->cap_ukids ? 2 * P->cap_ukids : 256, P->ukids = aici_realloc(P->ukids, P->cap_ukids * sizeof(kid_t));
    P->ukids[nk++] = (kid_t){ch, ns, sub};
    if (sub) weight += toks_weight(&sub->own, nw);
  }
  weight += nt;
  bool keep = P->bytes < PART_BYTES_MAX;
  tunion_t *u = aici_calloc(1, sizeof(tunion_t));
  u->c = c, u->run = i, u->lex0 = lex0, u->temp = !keep;
  if (weight * 4 > nw) {               /* a set: one OR per word beats scattered bits */
    u->toks.dense = aici_tokset_new();
    uint32_t *d = u->toks.dense->words;
    for (uint32_t k = 0; k < P->n_utmp; k++) d[P->utmp[k] >> 5] |= 1u << (P->utmp[k] & 31);
    for (uint32_t k = 0; k < nk; k++)
      if (P->ukids[k].sub) toks_or(&P->ukids[k].sub->own, d);
  } else {
    uint32_t n = P->n_utmp;
    u->toks.toks = weight ? aici_malloc((uint32_t)weight * 4) : 0;
    __builtin_memcpy(u->toks.toks, P->utmp, n * 4);
    for (uint32_t k = 0; k < nk; k++) {
      const part_t *sub = P->ukids[k].sub;
      if (!sub) continue;
      __builtin_memcpy(u->toks.toks + n, sub->own.toks, sub->own.n_toks * 4);
      n += sub->own.n_toks;
    }
    u->toks.n_toks = n;
  }
  u->kids = nk ? aici_malloc(nk * sizeof(kid_t)) : 0;
  if (nk) __builtin_memcpy(u->kids, P->ukids, nk * sizeof(kid_t));
  u->n_kids = nk;
  if (!keep) return u;                 /* the caller frees it (union_free) */
  P->bytes += (uint32_t)sizeof(tunion_t) + nk * (uint32_t)sizeof(kid_t) + (u->toks.dense ? nw * 4 : u->toks.n_toks * 4);
  if ((P->n_unions + 1) * 2 > P->utab_cap) {   /* grow (and first use): rehash */
    uint32_t cap = P->utab_cap ? 2 * P->utab_cap : 256;
    tunion_t **t = aici_calloc(cap, sizeof(tunion_t *));
    for (uint32_t k = 0; k < P->utab_cap; k++)
      if (P->utab[k]) {
        uint32_t x = union_hash(P->utab[k]->c, P->utab[k]->run, P->utab[k]->lex0) & (cap - 1);
        while (t[x]) x = (x + 1) & (cap - 1);
        t[x] = P->utab[k];
      }
    aici_free(P->utab);
    P->utab = t, P->utab_cap = cap;
    P->bytes += cap * (uint32_t)sizeof(tunion_t *) / 2;
    slot = h & (cap - 1);
    while (P->utab[slot]) slot = (slot + 1) & (cap - 1);
  }
  P->utab[slot] = u;
  P->n_unions++;
  return u;
}

/* Adds what part c's edges add at position `here` (its lexeme's start set: here.n_sets), not
 * c's own tokens (the caller's: a root part's beside its slice, a sub part's in its union);
 * returns the entry that records it (MEMO_NONE: none). */
static uint32_t part_apply(gr_matcher_t *m, const part_t *c, pos_t here, uint32_t *mask, uint32_t vocab, pos_t *stack) {
  parts_t *P = m->parts;
  uint32_t nw = (vocab + 31) / 32;
  uint32_t set_id = m->sets[here.n_sets - 1].id, found = memo_find(P, set_id, c);
  if (found != MEMO_NONE) {
    memo_t *x = &P->memo[found];
    if (!x->dense && x->weight >= 2 * nw && P->n_dense < MEMO_DENSE_MAX) {   /* replayed again: as one set */
      uint32_t *d = aici_calloc(nw, 4);
      memo_apply(P, found, d, nw);
      P->memo[found].dense = d;
      P->n_dense++;
    }
    memo_apply(P, found, mask, nw);
    return found;
  }
  uint32_t r0 = P->n_rec;
  bool rec = true;                     /* every child recorded so far */
  const aici_trie_t *wt = c->walked;
  const aici_trie_node_t *nodes = wt->nodes;
  /* an ended root part: one run, of its lexer state, over the root children; its unions are
   * shared by all such parts (keyed by no part: they depend on the start state only) */
  const edge_t *edges = c->ends ? P->top : c->edges;
  uint32_t n_edges = c->ends ? P->n_top : c->n_edges;
  /* Edges are sorted by (lexer state, byte): per lexer state the lexeme is ended once */
  for (uint32_t i = 0; i < n_edges;) {
    uint32_t from = c->ends ? EDGE_TOP >> 8 | c->lex : edges[i].key >> 8, run = c->ends ? n_edges : i;
    while (run < n_edges && edges[run].key >> 8 == from) run++;
    bool tok_start = from & (EDGE_TOP >> 8);
    from &= ~(EDGE_TOP >> 8);
    goto_pos(m, here);
    m->tok_start = tok_start;
    bool ended = emit(m, from) && !m->overflow;
    m->overflow = m->tok_start = false;
    if (!ended) { i = run; continue; }
    uint32_t top = m->n_sets, lex0 = m->sets[top - 1].lstart;
    ST(runs);
    tunion_t *u = run_union(m, c->ends ? 0 : c, edges, wt, i, run, lex0, vocab);
    toks_or(&u->toks, mask);
    if (u->temp) rec = false;          /* entries refer only to kept unions */
    else if (rec) rec_push(P, toks_word(&u->toks));
    for (uint32_t k = 0; k < u->n_kids; k++) {
      const kid_t *x = &u->kids[k];
      pos_t q = {top, x->lex, false};
      if (x->sub) {
        uint32_t e = part_apply(m, x->sub, q, mask, vocab, stack);
        if (e == MEMO_NONE) rec = false;
        else if (rec) rec_push(P, MEMO_CHILD | e);
      } else walk(m, wt, x->ch + 1, x->ch + (nodes[x->ch].w1 >> 10), q, mask, vocab, stack, rec ? P : 0);
    }
    if (u->temp) union_free(u);
    if (m->ls[lex0].n_acc) {           /* an empty lexeme, then the byte: stepped per position */
      for (; i < run;) {
        uint32_t key = edges[i].key, j = i;
        while (j < run && edges[j].key == key) j++;
        uint8_t b = (uint8_t)(key & 255);
        const int32_t *row = m->ls[lex0].row;
        int32_t r = row ? row[b] : -1;
        uint32_t ns = r >= 0 ? (uint32_t)r : lex_next(m, lex0, b);
        pos_t q = {here.n_sets, from, false};
        m->tok_start = tok_start;
        bool live = !ns && step(m, &q, b) && !m->overflow;
        m->overflow = m->tok_start = false;
        if (live) {
          for (uint32_t k = i; k < j; k++) {
            uint32_t ch = edges[k].child, tok = nodes[ch].w0 >> 8, size = nodes[ch].w1 >> 10;
            if (tok < vocab) {
              mask[tok >> 5] |= 1u << (tok & 31);
              if (rec) rec_push(P, tok);
            }
            if (size <= 1) continue;
            const part_t *sub = size >= SUB_MIN_NODES ? sub_part(m, wt, ch, q.lex, vocab) : 0;
            if (sub) {
              toks_or(&sub->own, mask);
              if (rec) rec_push(P, toks_word(&sub->own));
              uint32_t e = part_apply(m, sub, q, mask, vocab, stack);
              if (e == MEMO_NONE) rec = false;
              else if (rec) rec_push(P, MEMO_CHILD | e);
            } else walk(m, wt, ch + 1, ch + size, q, mask, vocab, stack, rec ? P : 0);
          }
        }
        i = j;
      }
    }
    i = run;
  }
  uint32_t e = rec ? memo_insert(P, set_id, c, r0, nw) : MEMO_NONE;
  P->n_rec = r0;
  return e;
}

void gr_mask(gr_matcher_t *m, const aici_trie_t *trie, aici_token_t eos, aici_tokset_t *out) {
  uint32_t *mask = out->words;
  pos_t *stack = aici_tmp_alloc((trie->max_depth + 2) * sizeof(pos_t));
  pos_t here = cur(m);
  if (!m->parts) m->parts = aici_calloc(1, sizeof(parts_t));
  part_t *c = root_part(m, trie, here.lex);
  if (!c) {
    aici_tokset_clear(out);
    walk(m, trie, 1, trie->n_nodes, here, mask, out->vocab, stack, 0);
  } else {
    const aici_slice_t *sl = c->slice;
    if (sl && sl->dense) __builtin_memcpy(mask, sl->dense, out->n_words * 4);
    else {
      aici_tokset_clear(out);
      if (sl) for (uint32_t i = 0; i < sl->n_words; i++) mask[sl->word_idx[i]] |= sl->word_bits[i];
    }
    toks_or(&c->own, mask);
    part_apply(m, c, here, mask, out->vocab, stack);
  }
  /* special tokens: each special-token terminal the position allows, its tokens without bytes */
  for (uint32_t t = 0; t < m->g->n_terms; t++) {
    const gr_term_t *x = &m->g->terms[t];
    if (x->token < 0) continue;
    pos_t q = here;
    if (!special_step(m, &q, spec_state(m, t + 1))) continue;
    for (uint32_t k = 0; k < x->n_tok_ranges; k++)
      for (uint32_t id = x->tok_ranges[2 * k]; id <= x->tok_ranges[2 * k + 1] && id < out->vocab; id++) {
        uint32_t len = 0;
        if (id != eos && !aici_token_bytes(id, &len)) mask[id >> 5] |= 1u << (id & 31);
      }
  }
  if (pos_accepting(m, here) && eos < out->vocab) mask[eos >> 5] |= 1u << (eos & 31);
  goto_pos(m, here);
#ifdef GR_STATS
  aici_logf("ST dor=%u lt=%u un=%u mh=%u sc=%u miss=%u new=%u lp=%u lpn=%u sl=%u runs=%u wn=%u ws=%u scans=%u reuse=%u items=%u parts=%u bytes=%u pool=%u memo=%u sci=%u sc=%u unions=%u mem=%u\n", st.dense_or, st.list_toks, st.unions, st.memo_hits, st.scan_cached, st.lexmiss, st.lexnew, st.lp, st.lp_nodes, st.slices, st.runs, st.walk_nodes, st.walk_steps, st.scans, st.scan_reuse, st.items, m->parts->n, m->parts->bytes, m->parts->n_pool, m->parts->n_memo, m->n_sc_items, m->n_sc, m->parts->n_unions, (uint32_t)__builtin_wasm_memory_size(0));
  __builtin_memset(&st, 0, sizeof st);
#endif
}

bool gr_can_continue(gr_matcher_t *m) {
  /* some byte keeps it alive */
  pos_t c = cur(m);
  for (int b = 0; b < 256; b++) {
    pos_t q = c;
    m->tok_start = true;               /* the next token's first byte */
    if (step(m, &q, (uint8_t)b) && !m->overflow) { goto_pos(m, c); m->tok_start = false; return true; }
    m->overflow = m->tok_start = false;
  }
  goto_pos(m, c);
  return false;
}
