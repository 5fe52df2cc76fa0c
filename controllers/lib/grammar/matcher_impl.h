/* matcher_impl.h - what the matcher's files share (not a public interface: grammar.h is):
 * the matcher's state, lexer states, Earley items and sets, parser positions, the parts of
 * masks, and the functions one file defines for another. */
#ifndef GR_MATCHER_IMPL_H
#define GR_MATCHER_IMPL_H
#include "grammar.h"

/* -DGR_STATS: each mask logs its work counters (profiling; "ST lp=... wn=...") and each lex_walk of 4,096 nodes or more ("WALK ...") */
#ifdef GR_STATS
struct gr_stats { uint32_t dense_or, list_toks, unions, memo_hits, scan_cached, lexmiss, lexnew, lp, lp_nodes, runs, walk_nodes, walk_steps, scans, scan_reuse, items, slices; };
extern struct gr_stats st;
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

typedef struct { uint32_t n_sets, lex; bool at_start; } pos_t;

static inline pos_t cur(const gr_matcher_t *m) { return (pos_t){m->n_sets, m->lex, m->at_start}; }
static inline void goto_pos(gr_matcher_t *m, pos_t p) { m->n_sets = p.n_sets; }

/* ---- parts of masks (slicer.c, mask.c) ---- */
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
  aici_tokset_t slice_set;             /* root parts with a dense slice: it, as a set ... */
  toks_t slice_toks;                   /* ... and as toks_t (memo entries refer to it) */
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
  uint64_t rent;                       /* trie nodes of root walks a cover slice would have cut short */
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

/* lexer.c */
uint32_t gm_lex_intern(gr_matcher_t *m, const uint32_t *p, uint32_t n);
void gm_lht_grow(gr_matcher_t *m);
const int32_t *gm_lex_row(gr_matcher_t *m, uint32_t id);
uint32_t gm_lex_next(gr_matcher_t *m, uint32_t id, uint8_t b);
uint32_t gm_lex_start(gr_matcher_t *m, const uint32_t *bits);
void gm_byte_classes(gr_matcher_t *m);

/* earley.c */
void gm_ht_reset(gr_matcher_t *m);
void gm_add_item(gr_matcher_t *m, uint32_t prod, uint32_t dot, uint32_t origin, uint32_t set_start);
void gm_closure(gr_matcher_t *m, uint32_t k, uint32_t start);
void gm_set_derive(gr_matcher_t *m, uint32_t k);
bool gm_scan(gr_matcher_t *m, uint32_t lex);
bool gm_emit(gr_matcher_t *m, uint32_t lex);
bool gm_step(gr_matcher_t *m, pos_t *p, uint8_t b);
bool gm_pos_accepting(gr_matcher_t *m, pos_t p);
uint32_t gm_spec_state(gr_matcher_t *m, uint32_t key);
bool gm_special_step(gr_matcher_t *m, pos_t *p, uint32_t fake);

/* matcher.c */
bool gm_lex_eager(gr_matcher_t *m, uint32_t id);

/* slicer.c */
void gm_walk(gr_matcher_t *m, const aici_trie_t *trie, uint32_t p, uint32_t end, pos_t top, uint32_t *mask, uint32_t vocab, pos_t *stack, parts_t *rec);
void gm_toks_or(const toks_t *t, uint32_t *mask);
part_t *gm_root_part(gr_matcher_t *m, const aici_trie_t *trie, uint32_t lex);
part_t *gm_root_part_sliced(gr_matcher_t *m, const aici_trie_t *trie, uint32_t lex, uint32_t max_rest);
part_t *gm_sub_part(gr_matcher_t *m, const aici_trie_t *t, uint32_t ch, uint32_t lex, uint32_t vocab);
bool gm_space_edge(const part_t *c, const edge_t *e);   /* at a word child of the base trie's space node */
uint32_t gm_space_kids(void);          /* the space node's word children */
const aici_trie_t *gm_space_trie(void);/* their subtrees after the space (NULL: none) */

/* mask.c */
void gm_rec_push(parts_t *P, uint32_t v);

#endif
