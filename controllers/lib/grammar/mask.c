/* mask.c - masks from parts: applying a part at a parser position (edge runs, their unions, the
 * memo of applications per set), and gr_mask, the library's mask entry point. */
#include "matcher_impl.h"

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

void gm_rec_push(parts_t *P, uint32_t v) {
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
    else if (v & MEMO_TOKS) gm_toks_or((const toks_t *)(uintptr_t)((v & ~MEMO_TOKS) << 2), mask);
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
static tunion_t *run_union(gr_matcher_t *m, const part_t *c, const edge_t *edges, const aici_trie_t *walked, uint32_t key,
                           uint32_t i, uint32_t end, uint32_t lex0, uint32_t vocab) {
  parts_t *P = m->parts;
  uint32_t h = union_hash(c, key, lex0), slot = 0;
  if (P->utab_cap)
    for (uint32_t k = h & (P->utab_cap - 1);; k = (k + 1) & (P->utab_cap - 1)) {
      tunion_t *u = P->utab[k];
      if (!u) { slot = k; break; }
      if (u->c == c && u->run == key && u->lex0 == lex0) return u;
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
    uint32_t ns = r >= 0 ? (uint32_t)r : gm_lex_next(m, lex0, b);
    if (!ns) continue;
    uint32_t ch = edges[k].child, tok = nodes[ch].w0 >> 8, size = nodes[ch].w1 >> 10;
    if (tok < vocab) {
      if (P->n_utmp == P->cap_utmp) P->cap_utmp = P->cap_utmp ? 2 * P->cap_utmp : 1024, P->utmp = aici_realloc(P->utmp, P->cap_utmp * 4);
      P->utmp[P->n_utmp++] = tok;
      nt++;
    }
    if (size <= 1) continue;
    const part_t *sub = size >= SUB_MIN_NODES ? gm_sub_part(m, walked, ch, ns, vocab) : 0;
    if (nk == P->cap_ukids) P->cap_ukids = P->cap_ukids ? 2 * P->cap_ukids : 256, P->ukids = aici_realloc(P->ukids, P->cap_ukids * sizeof(kid_t));
    P->ukids[nk++] = (kid_t){ch, ns, sub};
    if (sub) weight += toks_weight(&sub->own, nw);
  }
  weight += nt;
  bool keep = P->bytes < PART_BYTES_MAX;
  tunion_t *u = aici_calloc(1, sizeof(tunion_t));
  u->c = c, u->run = key, u->lex0 = lex0, u->temp = !keep;
  if (weight * 4 > nw) {               /* a set: one OR per word beats scattered bits */
    u->toks.dense = aici_tokset_new();
    uint32_t *d = u->toks.dense->words;
    for (uint32_t k = 0; k < P->n_utmp; k++) d[P->utmp[k] >> 5] |= 1u << (P->utmp[k] & 31);
    for (uint32_t k = 0; k < nk; k++)
      if (P->ukids[k].sub) gm_toks_or(&P->ukids[k].sub->own, d);
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

/* The root part of lexer state lex0 when it takes a dense slice (any: the text lexemes' UTF-8
 * slices, or a byte set's, a-z's whose rest is most of the trie included), else NULL (also when
 * the parts' memory is spent, or its lexeme ends at once; found without a walk,
 * gm_root_part_sliced): an ended root part's next lexeme walked as one root part, slice and all,
 * where its run over the root children walks the whole trie child by child (sub parts take no
 * slice). The same tokens and edges: the root children's subtrees from lex0 are the trie from
 * lex0. (Bounding the rest at a quarter of the trie, as before, left identifier and keyword
 * starts walking the whole trie in every fork: p99 0.80-0.91x without the bound, p50 0.88-0.90x;
 * arith 5-15 % slower at p50, bench/results/grammar_masks_gram29.txt.) */
static part_t *next_root(gr_matcher_t *m, const aici_trie_t *trie, uint32_t lex0) {
  part_t *r = gm_root_part_sliced(m, trie, lex0, trie->n_nodes);
  if (!r || r->ends || !r->slice->dense) return 0;
  if (!r->slice_toks.dense) {
    r->slice_set = (aici_tokset_t){.vocab = trie->vocab, .n_words = (trie->vocab + 31) / 32, .words = r->slice->dense};
    r->slice_toks.dense = &r->slice_set;
  }
  return r;
}

/* next_root for a root part's run [i, end) of edges at the root children that its own lexer
 * state cannot take (a lexeme that may go on, `=` before `==`, ends there) and whose next
 * lexeme starts in lex0: the root part of lex0 gives the same tokens and edges when lex0 takes
 * none of the other root children's bytes (those the lexeme goes on with, or a slice of it
 * holds) and does not accept (no empty lexeme to end before them). NULL otherwise. */
static part_t *next_root_run(gr_matcher_t *m, const part_t *c, const edge_t *edges, uint32_t i, uint32_t end,
                             uint32_t lex0) {
  if (m->ls[lex0].n_acc) return 0;
  uint32_t in[8] = {0};
  for (uint32_t k = i; k < end; k++) in[(edges[k].key & 255) >> 5] |= 1u << (edges[k].key & 31);
  for (uint32_t b = 0; b < 256; b++)
    if (!((in[b >> 5] >> (b & 31)) & 1) && gm_lex_next(m, lex0, (uint8_t)b)) return 0;
  return next_root(m, c->base, lex0);
}

static uint32_t part_apply(gr_matcher_t *m, const part_t *c, pos_t here, uint32_t *mask, uint32_t vocab, pos_t *stack);

/* The space trie's root part of lex0 for a run [i, end) of part c's edges whose tail [*mid, end)
 * is every word child of the base trie's space node (lexer state F, which takes none of them and
 * accepts: whitespace before a word): those edges, the next lexeme starting in lex0 at each
 * child's byte, add what lex0's root part over the space trie adds (the same subtrees from the
 * same state; an empty lexeme at a byte lex0 cannot take is an edge of that part, as next_root's),
 * with its slice: " word" tokens wholesale instead of a walk of every word child's subtree. NULL
 * (and *mid = end) when the tail is not all of them or lex0 takes no dense slice there. */
static part_t *space_run(gr_matcher_t *m, const part_t *c, const edge_t *edges, uint32_t i, uint32_t end,
                         uint32_t lex0, uint32_t *mid) {
  uint32_t k = end;
  *mid = end;
  while (k > i && gm_space_edge(c, &edges[k - 1])) k--;
  if (end - k != gm_space_kids() || k == end) return 0;
  part_t *r = next_root(m, gm_space_trie(), lex0);
  if (r) *mid = k;
  return r;
}

/* Adds root part r's tokens, slice and edges, its lexeme starting in lex0 on set `top`; false when
 * what it added is not recorded (rec: the caller's entry is being recorded). */
static bool root_apply(gr_matcher_t *m, const part_t *r, uint32_t top, uint32_t lex0, uint32_t *mask, uint32_t vocab,
                       pos_t *stack, bool rec) {
  parts_t *P = m->parts;
  pos_t q = {top, lex0, true};
  gm_toks_or(&r->slice_toks, mask);
  gm_toks_or(&r->own, mask);
  if (rec) gm_rec_push(P, toks_word(&r->slice_toks)), gm_rec_push(P, toks_word(&r->own));
  uint32_t e = part_apply(m, r, q, mask, vocab, stack);
  if (e == MEMO_NONE) return false;
  if (rec) gm_rec_push(P, MEMO_CHILD | e);
  return rec;
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
    bool ended = gm_emit(m, from) && !m->overflow;
    m->overflow = m->tok_start = false;
    if (!ended) { i = run; continue; }
    uint32_t top = m->n_sets, lex0 = m->sets[top - 1].lstart;
    ST(runs);
    part_t *r = c->ends ? next_root(m, wt, lex0)
              : tok_start && !c->node ? next_root_run(m, c, edges, i, run, lex0) : 0;
    if (r) {                           /* the next lexeme from its start: r's edges at the root
                                        * children (lex0 accepting) end it empty, as below */
      rec = root_apply(m, r, top, lex0, mask, vocab, stack, rec);
      i = run;
      continue;
    }
    /* the run's edges at the space node's word children: the space trie's root part */
    uint32_t mid = run;
    part_t *sr = c->ends || tok_start ? 0 : space_run(m, c, edges, i, run, lex0, &mid);
    if (sr) rec = root_apply(m, sr, top, lex0, mask, vocab, stack, rec);
    if (mid == i) { i = run; continue; }
    tunion_t *u = run_union(m, c->ends ? 0 : c, edges, wt, mid < run ? i | 0x80000000u : i, i, mid, lex0, vocab);
    gm_toks_or(&u->toks, mask);
    if (u->temp) rec = false;          /* entries refer only to kept unions */
    else if (rec) gm_rec_push(P, toks_word(&u->toks));
    for (uint32_t k = 0; k < u->n_kids; k++) {
      const kid_t *x = &u->kids[k];
      pos_t q = {top, x->lex, false};
      if (x->sub) {
        uint32_t e = part_apply(m, x->sub, q, mask, vocab, stack);
        if (e == MEMO_NONE) rec = false;
        else if (rec) gm_rec_push(P, MEMO_CHILD | e);
      } else gm_walk(m, wt, x->ch + 1, x->ch + (nodes[x->ch].w1 >> 10), q, mask, vocab, stack, rec ? P : 0);
    }
    if (u->temp) union_free(u);
    if (m->ls[lex0].n_acc) {           /* an empty lexeme, then the byte: stepped per position */
      for (; i < mid;) {
        uint32_t key = edges[i].key, j = i;
        while (j < mid && edges[j].key == key) j++;
        uint8_t b = (uint8_t)(key & 255);
        const int32_t *row = m->ls[lex0].row;
        int32_t r = row ? row[b] : -1;
        uint32_t ns = r >= 0 ? (uint32_t)r : gm_lex_next(m, lex0, b);
        pos_t q = {here.n_sets, from, false};
        m->tok_start = tok_start;
        bool live = !ns && gm_step(m, &q, b) && !m->overflow;
        m->overflow = m->tok_start = false;
        if (live) {
          for (uint32_t k = i; k < j; k++) {
            uint32_t ch = edges[k].child, tok = nodes[ch].w0 >> 8, size = nodes[ch].w1 >> 10;
            if (tok < vocab) {
              mask[tok >> 5] |= 1u << (tok & 31);
              if (rec) gm_rec_push(P, tok);
            }
            if (size <= 1) continue;
            const part_t *sub = size >= SUB_MIN_NODES ? gm_sub_part(m, wt, ch, q.lex, vocab) : 0;
            if (sub) {
              gm_toks_or(&sub->own, mask);
              if (rec) gm_rec_push(P, toks_word(&sub->own));
              uint32_t e = part_apply(m, sub, q, mask, vocab, stack);
              if (e == MEMO_NONE) rec = false;
              else if (rec) gm_rec_push(P, MEMO_CHILD | e);
            } else gm_walk(m, wt, ch + 1, ch + size, q, mask, vocab, stack, rec ? P : 0);
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
  part_t *c = gm_root_part(m, trie, here.lex);
  if (!c) {
    aici_tokset_clear(out);
    gm_walk(m, trie, 1, trie->n_nodes, here, mask, out->vocab, stack, 0);
  } else {
    const aici_slice_t *sl = c->slice;
    if (sl && sl->dense) __builtin_memcpy(mask, sl->dense, out->n_words * 4);
    else {
      aici_tokset_clear(out);
      if (sl) for (uint32_t i = 0; i < sl->n_words; i++) mask[sl->word_idx[i]] |= sl->word_bits[i];
    }
    gm_toks_or(&c->own, mask);
    part_apply(m, c, here, mask, out->vocab, stack);
  }
  /* special tokens: each special-token terminal the position allows, its tokens without bytes */
  for (uint32_t t = 0; t < m->g->n_terms; t++) {
    const gr_term_t *x = &m->g->terms[t];
    if (x->token < 0) continue;
    pos_t q = here;
    if (!gm_special_step(m, &q, gm_spec_state(m, t + 1))) continue;
    for (uint32_t k = 0; k < x->n_tok_ranges; k++)
      for (uint32_t id = x->tok_ranges[2 * k]; id <= x->tok_ranges[2 * k + 1] && id < out->vocab; id++) {
        uint32_t len = 0;
        if (id != eos && !aici_token_bytes(id, &len)) mask[id >> 5] |= 1u << (id & 31);
      }
  }
  if (gm_pos_accepting(m, here) && eos < out->vocab) mask[eos >> 5] |= 1u << (eos & 31);
  goto_pos(m, here);
#ifdef GR_STATS
  aici_logf("ST dor=%u lt=%u un=%u mh=%u sc=%u miss=%u new=%u lp=%u lpn=%u sl=%u runs=%u wn=%u ws=%u scans=%u reuse=%u items=%u parts=%u bytes=%u pool=%u memo=%u sci=%u sc=%u unions=%u mem=%u\n", st.dense_or, st.list_toks, st.unions, st.memo_hits, st.scan_cached, st.lexmiss, st.lexnew, st.lp, st.lp_nodes, st.slices, st.runs, st.walk_nodes, st.walk_steps, st.scans, st.scan_reuse, st.items, m->parts->n, m->parts->bytes, m->parts->n_pool, m->parts->n_memo, m->n_sc_items, m->n_sc, m->parts->n_unions, (uint32_t)__builtin_wasm_memory_size(0));
  __builtin_memset(&st, 0, sizeof st);
#endif
}
