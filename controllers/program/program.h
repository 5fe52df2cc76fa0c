/* Internal header of the `program` controller (docs/program.md).
 *
 * The program (XGrammar's structural-tag formats plus fork / wait / captures) is compiled into an
 * NFA over "leaves": byte-level matchers (a literal, an SDK regex DFA, the json controller's
 * pushdown matcher, free text that excludes strings) and token-level ones (one token from a set).
 * Combinators (sequence, or, repeats, tags, triggered tags) are epsilon edges between them;
 * captures, waits and forks are epsilon nodes with an action. The interpreter runs the NFA as a
 * set of live states (leaf, leaf state); a mask is a walk of the token trie over that set, so a
 * token whose bytes end one element and start the next is allowed iff its bytes fit. */
#ifndef PROGRAM_H
#define PROGRAM_H
#include "../json/matcher.h"
#include "../grammar/grammar.h"

#define MAX_STATES 16u       /* live states at once (more: the extra are dropped, logged once) */
#define MAX_JSON 2u          /* json-leaf states at once (each carries a matcher configuration set) */
#define MAX_GRAM 2u          /* grammar-leaf states at once (each a position of its node's matcher) */
#define MAX_NAMES 16u        /* named elements (captured variables) in one program */
#define MAX_LABELS 8u        /* labels (backtrack targets) in one program */
#define MAX_CAPS (MAX_NAMES + MAX_LABELS)   /* slots: a name's or a label's start position */
#define MAX_NODES 65536u

enum {
  G_LIT,                     /* leaf: a literal byte string */
  G_RE,                      /* leaf: an SDK regex */
  G_JSON,                    /* leaf: a JSON Schema (the json controller's matcher) */
  G_TEXT,                    /* leaf: free text not containing any of its excludes */
  G_TOK,                     /* leaf: one token of a set (token, exclude_token) */
  G_GRAM,                    /* leaf: a context-free grammar (the grammar controller's core) */
  G_EPS,                     /* epsilon: continue with any of next[] */
  G_OPEN, G_CLOSE,           /* epsilon: start / end of captured element `cap` */
  G_WAIT,                    /* barrier: continue once every variable in vars is set */
  G_FORK,                    /* barrier: fork; sequence i continues with next[i] */
  G_END,                     /* the program's end: EOS allowed */
  G_BT,                      /* barrier: backtrack to label `cap`, force `parts`, go on with next[0] */
};

typedef struct {
  uint32_t nodes;            /* states: 1 + number of automaton nodes (state 0 is dead) */
  uint32_t *go;              /* go[s * 256 + b]: the next state */
  uint8_t *hit;              /* hit[s]: s ends an excluded string (the text is dead there) */
} ac_t;

typedef struct gnode {
  uint8_t kind;
  uint32_t *next, n_next;
  uint32_t cap;              /* G_OPEN / G_CLOSE: capture slot */
  float temperature;         /* leaves: the innermost enclosing "temperature" (0: none) */
  bool has_temperature;
  /* leaves */
  uint8_t *lit; uint32_t lit_len;            /* G_LIT */
  aici_regex_t *re;                          /* G_RE */
  matcher_t *json;                           /* G_JSON */
  ac_t ac; uint32_t max_tokens;              /* G_TEXT; G_JSON: complete_by (UINT32_MAX: none) */
  aici_tokset_t *toks;                       /* G_TOK */
  /* G_GRAM: the node's matcher holds one text at a time ("physical"); ph[i] is the hash of its
   * first i bytes (ph_len of them valid), so a state (a mark, its length and hash) can tell
   * whether the matcher still holds its text: every use restores the mark of a prefix of it */
  gr_grammar_t *gram; gr_matcher_t *gm; gr_mark_t g0;
  uint64_t *ph; uint32_t ph_len, ph_cap;
  aici_tokset_t *gmask;
  bool tail_is_end;          /* leaves: every continuation after the leaf is the program's end */
  /* regex / json leaves followed only by literals (or the end, barriers, token leaves): the
   * tokens that may cross from the leaf into what follows (nfa.c, state_mask); built on first use */
  uint8_t cross;             /* 0: not built, 1: built, 2: what follows is not only literals */
  aici_token_t *cross_toks; uint32_t n_cross;
  /* G_WAIT: the variables; G_BT: the text parts (literal bytes, or a variable's name) */
  char **vars; uint32_t n_vars;
  uint32_t *part_len; uint8_t *part_is_var;  /* G_BT: vars[i] holds part i (part_len[i] bytes) */
} gnode_t;

typedef struct {
  char *name;
  bool append;
  bool label;                /* a label: its start is recorded (G_OPEN), nothing is captured */
} cap_t;

typedef struct {
  gnode_t *g;
  uint32_t n, cap_nodes;
  uint32_t start;
  cap_t caps[MAX_CAPS];
  uint32_t n_caps;
  uint32_t n_names, n_labels;
  bool uses_fork, uses_backtrack;
  char *fork_ptr;             /* the first fork's JSON pointer */
  char *backtrack_ptr;        /* the first backtrack's JSON pointer */
} program_t;

/* ---- compiling (compile.c) ---------------------------------------------------------------- */
/* The program in `text` (JSON); false with *err (heap): "at POINTER: WHY". */
bool program_compile(const char *text, uint32_t len, program_t *p, char **err);

/* A grammar leaf's matcher, made once its `gram` is compiled (nfa.c). */
void gram_init(gnode_t *g);

/* ---- states (nfa.c) --------------------------------------------------------------------- */
typedef struct {
  uint32_t node;             /* a leaf, G_END, or a parked barrier (G_WAIT / G_FORK) */
  uint32_t s;                /* leaf state (lit: position + 1; re: DFA state; json: index into js; text: AC state) */
  uint32_t n_tok;            /* G_TEXT: tokens taken in this leaf */
} st_t;

/* What a state's path has captured (advance mode only: mask walks do not track captures): the
 * byte offsets where open captures started, and completed captures not yet written. */
#define MAX_EV 8u
typedef struct { uint32_t cap, start, end; } cev_t;
typedef struct {
  uint32_t open[MAX_CAPS];
  cev_t ev[MAX_EV];
  uint32_t n_ev;
} path_t;

typedef struct { gr_mark_t mark; uint32_t len; uint64_t h; } gst_t;   /* a grammar leaf's position */

typedef struct {
  uint32_t n, nj, ng;
  st_t st[MAX_STATES];
  cset_t js[MAX_JSON];
  gst_t gs[MAX_GRAM];
} sset_t;

#define NO_POS 0xffffffffu

typedef struct {
  program_t *p;
  path_t *caps;             /* NULL: do not track captures (mask walks) */
  const path_t *in_caps;
  uint32_t pos;              /* byte offset of the byte being consumed (captures) */
  bool barriers_open;        /* cross a wait whose variables are set (advance mode) */
} stepctx_t;

/* The states at the program's start (closure of p->start). */
void nfa_start(program_t *p, sset_t *out, path_t *caps);
/* The set after one byte; false when none is left (a parked barrier or the end never continue). */
bool nfa_step(stepctx_t *c, const sset_t *in, uint8_t byte, sset_t *out);
/* The set after a whole token (token-level leaves take it whole; the others its bytes). */
bool nfa_advance_token(stepctx_t *c, const sset_t *in, aici_token_t t, sset_t *out);
/* The states after backtrack node `bt` (the closure of what follows it), its path's positions
 * after byte `cut` dropped (they name removed text), at byte offset `pos`. */
void nfa_resume(stepctx_t *c, uint32_t bt, const path_t *path, uint32_t cut, sset_t *out);
/* Re-run the closure of parked waits (now that variables may be set) and of `fork` branch i. */
void nfa_reopen(stepctx_t *c, sset_t *set, int fork_branch);
/* The shortest ASCII bytes that complete the JSON document of state i (a G_JSON leaf) so that it
 * is accepted: heap, *n (0: it accepts already); NULL when none is found within the search's
 * limits (4096 configurations, 512 bytes). */
uint8_t *nfa_json_completion(program_t *p, const sset_t *set, uint32_t i, uint32_t *n);
/* The forced bytes (at most 256) after state i has taken `bytes` (e.g. a tag's end after its
 * completed document); 0 when the bytes do not fit. */
uint32_t nfa_forced_after(program_t *p, const sset_t *set, uint32_t i, const uint8_t *bytes, uint32_t n);
bool nfa_at_end(const program_t *p, const sset_t *set);        /* G_END is live: EOS allowed */
bool nfa_only_end(const program_t *p, const sset_t *set);
int nfa_forced_byte(const program_t *p, const sset_t *set);    /* -1: none or several */
/* The mask (owned by the interpreter: valid until the next call). */
const aici_tokset_t *nfa_mask(program_t *p, const aici_trie_t *trie, const sset_t *set, aici_token_t eos);
void nfa_prepare(program_t *p, const aici_trie_t *trie);
/* Whether some longer token starting with t's bytes is live from `after` (the state after t):
 * forced text ending in t may then be written with that token instead, so t is left open. */
bool nfa_token_may_grow(program_t *p, const aici_trie_t *trie, aici_token_t t, const sset_t *after);

#endif
