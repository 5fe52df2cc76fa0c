/* matcher.c - the grammar's matcher (the public API; the parts are in lexer.c, earley.c,
 * slicer.c and mask.c, their shared types in matcher_impl.h): an Earley parser over lexemes, a lexer DFA built lazily
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
#include "matcher_impl.h"

#ifdef GR_STATS
struct gr_stats st;
#endif

/* ---- public API -------------------------------------------------------------------------- */
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
  gm_byte_classes(m);
  gm_lht_grow(m);
  /* set 0 */
  m->sets[0].start = 0;
  m->sets[1].start = 0;
  m->sets[0].prov_lex = -1;
  m->sets[0].id = m->next_id = 1;
  m->n_sets = m->valid = 1;
  gm_ht_reset(m);
  gm_add_item(m, g->start_prod, 0, 0, 0);
  gm_closure(m, 0, 0);
  gm_set_derive(m, 0);
  m->lex = m->sets[0].lstart;
  m->at_start = true;
  return m;
}

/* ---- max_tokens lexemes ------------------------------------------------------------------
 * As llguidance's parser (earley/parser.rs, apply_token): each lexeme's row has a start byte and
 * the token holding it (row_tok). A lexeme that no byte can extend, or a lazy one once it
 * matches, ends at its last byte, and the next row starts at the byte after it (at byte 0 when
 * it ended at the text's first byte); other lexemes end at the byte that cannot extend them,
 * which starts the next row. After a token in whose last byte no row began, the terminals of the
 * lexer state whose max_tokens is at most the tokens from row_tok to this one are dropped from
 * it; if none is left, the lexeme ends there as the first of them, matched or not (llguidance's
 * force_lexeme_end), and the next row starts one byte past the token's end. */
bool gm_lex_eager(gr_matcher_t *m, uint32_t id) {   /* ends at its last byte */
  lstate_t *s = &m->ls[id];
  if (s->eager < 0) {
    bool ext = false;
    for (uint32_t c = 0; c < m->n_cls && !ext; c++) ext = gm_lex_next(m, id, m->cls_bytes[m->cls_off[c]]) != 0;
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
  if (keep) { p->lex = gm_lex_intern(m, m->tmp_pairs, keep); return false; }
  uint32_t fake = gm_spec_state(m, 0x40000000u | m->pairs[off]);   /* pairs are sorted by terminal */
  goto_pos(m, *p);
  if (!gm_scan(m, fake) || m->overflow) { m->overflow = false; goto_pos(m, *p); return false; }
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
    if (!gm_step(m, &p, bytes[i]) || m->overflow) { goto_pos(m, save); m->overflow = false; m->tok_start = false; return false; }
    if (!counted) continue;
    last_row = false;
    if (!gm_lex_next(m, prev, bytes[i])) {  /* this byte began a new lexeme */
      uint32_t x = b0 + i;
      if (gm_lex_eager(m, prev)) row_byte = x == 1 ? 0 : x;   /* its row began at the byte before */
      else row_byte = x, last_row = true;
    }
  }
  m->tok_start = false;
  if (counted && n) {
    if (row_byte >= b0) row_tok = tok;
    if (!last_row && !gm_lex_eager(m, p.lex) && limit_tokens(m, &p, tok + 1 - row_tok))
      row_byte = b0 + n + 1, row_tok = tok;
  }
  m->n_sets = p.n_sets, m->lex = p.lex, m->at_start = p.at_start;
  m->n_tok = tok + 1, m->n_byte = b0 + n, m->row_byte = row_byte, m->row_tok = row_tok;
  return true;
}

bool gr_advance_token(gr_matcher_t *m, aici_token_t t) {
  pos_t p = cur(m), save = p;
  if (t >= 0x80000000u || !gm_special_step(m, &p, gm_spec_state(m, 0x80000000u | t))) { goto_pos(m, save); return false; }
  m->n_sets = p.n_sets, m->lex = p.lex, m->at_start = p.at_start;
  m->row_byte = m->n_byte, m->row_tok = m->n_tok++;   /* the next lexeme's row */
  return true;
}

bool gr_accepting(gr_matcher_t *m) {
  pos_t c = cur(m);
  bool a = gm_pos_accepting(m, c);
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

bool gr_can_continue(gr_matcher_t *m) {
  /* some byte keeps it alive */
  pos_t c = cur(m);
  for (int b = 0; b < 256; b++) {
    pos_t q = c;
    m->tok_start = true;               /* the next token's first byte */
    if (gm_step(m, &q, (uint8_t)b) && !m->overflow) { goto_pos(m, c); m->tok_start = false; return true; }
    m->overflow = m->tok_start = false;
  }
  goto_pos(m, c);
  return false;
}
