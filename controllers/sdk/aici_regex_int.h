/* aici_regex_int.h: what the regex constraint's parts share (internal): the regex's state, its
 * limits, the calls between parts. aici_regex.c: the parser and aici_regex_compile;
 * aici_regex_dfa.c: the automata (NFA, its lazily built DFA, stepping); aici_regex_mask.c: masks
 * by trie walk, slices, the mask cache and masks shared between states. */
#ifndef AICI_REGEX_INT_H
#define AICI_REGEX_INT_H
#include "aici.h"

enum { A_SET, A_CAT, A_ALT, A_REP, A_EMPTY };
typedef struct { uint8_t kind; uint32_t a, b, set; int32_t min, max; } ast_t;

enum { N_FAIL, N_CONSUME, N_SPLIT, N_MATCH };
typedef struct { uint8_t kind, live; uint32_t out, out1, set; } nfa_t;

#define MAX_NFA 200000u
#define MAX_DFA 16384u
#define MAX_CAND 6                     /* candidate slices per regex */
#define MAX_CAND_U8 4                  /* candidate UTF-8 slices per regex (text mode) */
#define MAX_SL (MAX_CAND + MAX_CAND_U8 + 6)  /* and the SDK's standard slices */
#define REP_MIN 8                      /* {m,n} with n >= REP_MIN counts as repeated */
#define COVER_STATES 64                /* states a slice check follows before giving up */
#define BUILT 1
#define ACCEPT 2
#define CLOSED 4                       /* every state reachable from it has its row built */
#define FINAL 8                        /* a match that nothing extends: its row is all dead */
#define END_BIT 0x80000000u            /* in a row entry: the target is FINAL (walks skip its subtree) */
#define CLOSE_ROWS 1024u               /* rows close_state builds at most (per regex) */
#define EQ_RECENT 16                   /* masks computed lately, the candidates a new state may share */
#define EQ_PAIRS 2048u                 /* state pairs one same_masks check follows before giving up */
#define SLICES_AFTER 4u                /* default: masks walked whole before slices are built */

struct aici_regex {
  uint32_t (*sets)[8];                 /* byte sets (256 bits) used by the pattern */
  uint32_t n_sets;
  nfa_t *nfa;
  uint32_t n_nfa, cap_nfa, start_nfa;
  uint8_t cls[256];                    /* byte -> equivalence class */
  uint8_t rep[256];                    /* class -> a representative byte */
  uint32_t n_cls;
  /* DFA: state 0 is dead */
  uint32_t n_states, cap_states;
  uint32_t *trans;                     /* [state * 256 + byte] */
  uint8_t *flags;
  uint32_t *set_off, *set_len, *set_hash;
  uint32_t *pool, pool_len, pool_cap;  /* sorted NFA-state lists of all DFA states */
  uint32_t *ht, ht_cap;                /* open addressing: DFA ids, 0 = empty slot */
  uint32_t *mark, gen, *list, *stk;    /* closure scratch, sized n_nfa */
  uint32_t start;
  aici_tokset_t **cache;               /* per DFA state, up to cache_limit */
  uint32_t cache_n, cache_limit;
  aici_tokset_t *spare;                /* mask_cached's result once the cache is full */
  /* masks shared between states that no token tells apart (see same_masks) */
  uint32_t eq_recent[EQ_RECENT], eq_sig[EQ_RECENT], eq_n, eq_next;  /* states whose masks were computed */
  uint64_t *eq_seen;                   /* same_masks' visited pairs (open addressing, 0 = empty) */
  uint32_t *eq_q;                      /* its queue: pair a, pair b, depth */
  bool overflow;
  bool use_slices;
  uint32_t slices_after;               /* own slices once masks walked that many whole tries' nodes */
  uint64_t walked;                     /* trie nodes the masks visited so far (the rent) */
  /* slices (see aici_regex_use_slices) */
  uint32_t n_cand;
  uint32_t cand[MAX_CAND][8];          /* byte sets the pattern repeats */
  uint32_t utf8_node;                  /* text mode: AST node id + 1 of "one multi-byte character" */
  uint32_t n_cand_u8;
  uint32_t cand_u8[MAX_CAND_U8][4];    /* ASCII sets A the pattern repeats beside any character */
  const aici_trie_t *slice_trie;       /* the trie sl[] was resolved for */
  bool own_slices;                     /* sl[] holds the pattern's own candidates too */
  uint32_t n_sl;
  const aici_slice_t *sl[MAX_SL];      /* the worthwhile ones, fewest rest nodes first */
  uint8_t sl_reps[MAX_SL][256];        /* one byte per regex byte class within the slice */
  uint32_t sl_n_reps[MAX_SL];
  uint8_t *pick;                       /* per DFA state: 0 unknown, 1 no slice, 2 + k: sl[k] */
  uint32_t *stamp, stamp_gen;          /* close_state's visited marks */
  bool close_failed;                   /* the DFA is too big to close: walks check rows */
};

static inline bool same_set(const uint32_t *a, const uint32_t *b) {   /* 256-bit sets */
  uint32_t d = 0;
  for (int w = 0; w < 8; w++) d |= a[w] ^ b[w];
  return !d;
}

/* Fragment sharing (see rx_compile): (canonical node, successor) -> NFA state */
typedef struct {
  const ast_t *ast;
  const uint32_t *canon;
  uint32_t *memo, cap, n;              /* open addressing: (canon node, next) -> NFA state + 1 */
} frag_t;

uint32_t rx_nfa_new(aici_regex_t *re, uint8_t kind, uint32_t out, uint32_t out1, uint32_t set);
uint32_t rx_compile(aici_regex_t *re, frag_t *f, uint32_t node, uint32_t next);
uint32_t *rx_canonical_ids(const aici_regex_t *re, const ast_t *ast, uint32_t n);
void rx_mark_live(aici_regex_t *re);
void rx_byte_classes(aici_regex_t *re);
void rx_collect(aici_regex_t *re, const ast_t *ast, uint32_t node, bool rep);
void rx_closure(aici_regex_t *re, uint32_t s, uint32_t *n);
bool rx_grow_states(aici_regex_t *re);
uint32_t rx_intern(aici_regex_t *re, uint32_t n);
void rx_build_row(aici_regex_t *re, uint32_t d);

#endif
