/* lark_impl.h - what the Lark front-end's parser (lark_parse.c) and lowering (lark.c) share:
 * expression trees, definitions, the parser state, and the functions one defines for the other. */
#ifndef GR_LARK_IMPL_H
#define GR_LARK_IMPL_H
#include "grammar.h"

/* ---- expression trees -------------------------------------------------------------------- */
enum { E_SEQ, E_ALT, E_REP, E_STR, E_RE, E_NAME, E_RANGE, E_EMPTY, E_SPECIAL, E_JSON };
typedef struct ex {
  uint8_t kind;
  bool icase, dotall;
  uint32_t line, n, min, max;          /* REP: max UINT32_MAX = unbounded */
  const char *s;                       /* STR: bytes; RE: pattern; NAME: name */
  uint32_t slen, lo, hi;               /* RANGE: code points */
  struct ex **kids;
} ex_t;

typedef struct {
  const char *name;
  uint32_t nlen, line;
  ex_t *body;
  bool term, lazy, common;
  ex_t *stop;                          /* [stop="S"]: the lexeme ends at its first S (S included) */
  uint32_t max_tokens;                 /* [max_tokens=N]: N + 1 (0: none; 1: max_tokens=0) */
  uint32_t sym;                        /* resolved symbol (when `resolved`) */
  bool resolved;
} def_t;

typedef struct {
  const char *s;
  uint32_t i, n, line;
  char *err;
  def_t *defs;
  uint32_t n_defs, cap_defs;
  gr_grammar_t *g;
  ex_t **ignores;
  uint32_t n_ignores;
  char **imports;                      /* "NAME" or "ALIAS=NAME" of common */
  uint32_t n_imports;
  uint32_t n_helpers;
} lp_t;

/* lark_parse.c */
bool lk_is_term_name(const char *s, uint32_t n);
void lk_parse_defs(lp_t *p, bool common);

#endif
