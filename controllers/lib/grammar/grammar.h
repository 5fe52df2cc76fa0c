/* grammar.h - a context-free grammar matcher core (Lark and GBNF front-ends, an Earley parser
 * over lexemes, masks by a token-trie walk). A library: no aici_step in it, so another
 * controller can compile these sources in (the `grammar` controller's main.c is a thin user).
 *
 * Semantics follow llguidance's (its docs/syntax.md): terminals are lexemes, matched by a lazily
 * built DFA over the terminals the parser allows at that point; a lexeme ends when the next byte
 * cannot extend it (longest match), or at its first match when it is `lazy`; `%ignore` terminals
 * may come between any two lexemes. A token is allowed iff its bytes keep some continuation of
 * the grammar possible.
 *
 * Sources: grammar.c, lark.c, gbnf.c, rx.c (the front ends and regex text); matcher.c (this
 * API), lexer.c, earley.c, slicer.c, mask.c (the matcher, sharing matcher_impl.h); json_term.c
 * (%json, over the json library, which lib.json names).
 *
 * Memory: everything is heap (aici_malloc); out of guest memory traps (docs/protocol.md#limits). Errors: the
 * compilers return NULL with a heap message naming the construct and its line ("line 3:
 * unsupported: %declare"); nothing here traps on bad input.
 */
#ifndef GRAMMAR_H
#define GRAMMAR_H
#include "aici.h"

typedef struct gr_grammar gr_grammar_t;
typedef struct gr_matcher gr_matcher_t;
typedef struct gr_json gr_json_t;

/* ---- compiled grammar (built by a front-end) --------------------------------------------- */
#define GR_NT 0x80000000u              /* a symbol with this bit is a nonterminal, else a terminal */

typedef struct {
  char *name;                          /* for errors and logs */
  char *regex;                         /* SDK regex text over bytes (UTF-8 expanded) */
  uint32_t regex_len;
  bool lazy;                           /* ends at its first match */
  bool stop;                           /* [stop="S"]: what follows it starts a new token (llguidance) */
  bool unique;                         /* not merged with same-text terminals */
  uint32_t max_tokens;                 /* [max_tokens=N] (N >= 1; 0: no limit): spans at most N tokens */
  int32_t token;                       /* >= 0: a special-token terminal (matched by id, no bytes) */
  uint32_t *tok_ranges, n_tok_ranges;  /* its token ids: [lo, hi] pairs (inclusive) */
  char *special_name;                  /* <|name|>: resolved to an id by gr_finish (host tokenizer) */
  aici_regex_t *re;                    /* NULL for special-token and %json terminals */
  gr_json_t *json;                     /* %json{...}: the json matcher's documents (json_term.c) */
} gr_term_t;

typedef struct { uint32_t lhs, n, *syms; } gr_prod_t;

struct gr_grammar {
  gr_term_t *terms;
  uint32_t n_terms, cap_terms;
  gr_prod_t *prods;                    /* after gr_finish: sorted by lhs */
  uint32_t n_prods, cap_prods;
  char **nt_names;
  uint32_t n_nts, cap_nts;
  uint32_t start;                      /* nonterminal index */
  int32_t skip;                        /* the %ignore terminal, -1: none */
  bool has_max_tokens;                 /* some terminal has max_tokens */
  /* derived by gr_finish */
  uint32_t *nt_first, *nt_count;       /* productions of nonterminal k: prods[nt_first[k] ..] */
  bool *nullable;
  uint32_t start_prod;                 /* the augmented production S' -> start */
};

/* Front-ends. `len` bytes of grammar text; NULL on error with *err a heap message. */
gr_grammar_t *gr_compile_lark(const char *text, uint32_t len, char **err);
gr_grammar_t *gr_compile_gbnf(const char *text, uint32_t len, char **err);
/* Detects the syntax: GBNF when the first definition uses `::=`, else Lark. */
gr_grammar_t *gr_compile(const char *text, uint32_t len, char **err);

/* ---- building blocks the front-ends share (grammar.c) ------------------------------------ */
uint32_t gr_add_nt(gr_grammar_t *g, const char *name, uint32_t len);
/* `unique`: never merged with another terminal of the same text (lazy ones, %ignore). */
uint32_t gr_add_term(gr_grammar_t *g, const char *name, uint32_t nlen, const char *regex, uint32_t rlen, bool unique);
void gr_add_prod(gr_grammar_t *g, uint32_t lhs, const uint32_t *syms, uint32_t n);
/* A special-token terminal: ids [lo, hi] pairs, or a name resolved in gr_finish. */
uint32_t gr_add_special(gr_grammar_t *g, const char *name, uint32_t nlen, const uint32_t *ranges, uint32_t n_ranges);
/* Compiles the terminals' regexes, resolves special-token names (one token, without bytes, from
 * the host's tokenizer) and derives the tables; false with *err on a bad regex or name. */
bool gr_finish(gr_grammar_t *g, char **err);
char *gr_strdup(const char *s, uint32_t n);
char *gr_fmt(const char *fmt, ...);   /* heap string: %s %.*s %u %d */

/* A %json{SCHEMA} terminal: one lexeme, a document the json controller's matcher accepts. */
uint32_t gr_add_json(gr_grammar_t *g, const char *schema, uint32_t len, char **err);

/* ---- %json lexemes (json_term.c): lexer states are ids >= 1 (0: dead) ------------------- */
/* NULL with *err (heap) when the schema is not JSON, not supported, or admits no document. */
gr_json_t *gr_json_compile(const char *schema, uint32_t len, char **err);
uint32_t gr_json_start(gr_json_t *j);
uint32_t gr_json_step(gr_json_t *j, uint32_t state, uint8_t byte);
bool gr_json_accepting(gr_json_t *j, uint32_t state);

/* ---- regex text (rx.c): Rust/Python regex syntax -> SDK regex over UTF-8 bytes ---------- */
/* (Text is built in the SDK's aici_buf_t; character classes become regex text by aici_cps_regex.) */
/* Translate a /regex/ with flags (i: ASCII case-insensitive, s: . matches \n) into `out`.
 * false with *why (static) on unsupported syntax (lookaround, backreferences, anchors). */
bool gr_regex_translate(aici_buf_t *out, const char *pat, uint32_t len, bool icase, bool dotall, const char **why);
/* A string literal's bytes as regex text (icase: ASCII letters either case). */
void gr_regex_literal(aici_buf_t *out, const uint8_t *s, uint32_t len, bool icase);
/* The code points [lo, hi] (inclusive) as regex text over UTF-8. */
void gr_regex_cp_range(aici_buf_t *out, uint32_t lo, uint32_t hi);

/* ---- matcher (matcher.c; lexer.c, earley.c, slicer.c, mask.c share matcher_impl.h) ----- */
/* What masks share across grammars (slices of the token trie for identifier byte sets), built
 * once per tokenizer: call it in the controller's init (AICI_EXPORT_INIT) so that every request
 * starts with it from the snapshot. Optional (masks are the same without it); idempotent. */
void gr_prepare_tokenizer(const aici_trie_t *trie);
gr_matcher_t *gr_matcher_new(gr_grammar_t *g);
/* Feed one token's bytes; false (state unchanged) when they leave the grammar. Each call counts
 * as one token for `stop` lexemes (what follows starts a new token) and `max_tokens` ones. */
bool gr_advance(gr_matcher_t *m, const uint8_t *bytes, uint32_t n);
/* Feed a special token (no bytes); false when not allowed here (always, for now: grammars
 * with special tokens are refused at compile time). */
bool gr_advance_token(gr_matcher_t *m, aici_token_t t);
bool gr_accepting(gr_matcher_t *m);   /* the text so far is a sentence of the grammar */
bool gr_can_continue(gr_matcher_t *m);/* some byte or special token may follow */
/* Tokens whose bytes keep the text a prefix of a sentence, plus `eos` when accepting, into
 * `out` (overwritten). */
void gr_mask(gr_matcher_t *m, const aici_trie_t *trie, aici_token_t eos, aici_tokset_t *out);
/* Save / restore the matcher's position: a mark taken on the current text, or on a prefix of it
 * (restoring to it is backtracking); marks of text no longer a prefix are invalid. */
typedef struct { uint32_t n_sets, lex, at_start, n_tok, n_byte, row_byte, row_tok; } gr_mark_t;
gr_mark_t gr_save(const gr_matcher_t *m);
void gr_restore(gr_matcher_t *m, gr_mark_t mark);

#endif
