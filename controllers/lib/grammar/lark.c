/* lark.c - the Lark front-end (llguidance's dialect, its docs/syntax.md): definitions (from the
 * parser, lark_parse.c) -> terminals as regex text (uppercase names, strings, /regex/) and
 * productions (lowercase names; * + ? {m,n} ~ [ ] become helper nonterminals, left-recursive),
 * and gr_compile_lark. Errors name the construct and the line. */
#include "lark_impl.h"

/* ---- lowering ---------------------------------------------------------------------------- */
static def_t *find_def(lp_t *p, const char *name, uint32_t n, bool common_scope) {
  for (uint32_t k = 0; k < p->n_defs; k++)
    if (p->defs[k].common == common_scope && p->defs[k].nlen == n && !__builtin_memcmp(p->defs[k].name, name, n))
      return &p->defs[k];
  if (common_scope) return 0;
  for (uint32_t k = 0; k < p->n_imports; k++) {   /* ALIAS=NAME */
    const char *im = p->imports[k];
    uint32_t eq = 0;
    while (im[eq] != '=') eq++;
    if (eq == n && !__builtin_memcmp(im, name, n)) {
      const char *real = im + eq + 1;
      def_t *d = find_def(p, real, (uint32_t)__builtin_strlen(real), true);
      if (!d) p->err = gr_fmt("line %u: %%import common.%s: no such terminal", p->line, real);
      return d;
    }
  }
  return 0;
}

static void term_regex(lp_t *p, ex_t *e, aici_buf_t *o, bool common, uint32_t depth);

static void def_regex(lp_t *p, def_t *d, aici_buf_t *o, uint32_t depth) {
  if (depth > 200) { p->err = gr_fmt("line %u: terminal %.*s is recursive", d->line, (int)d->nlen, d->name); return; }
  if (!d->term) { p->err = gr_fmt("line %u: a terminal cannot use rule %.*s", d->line, (int)d->nlen, d->name); return; }
  aici_buf_puts(o, "(?:");
  term_regex(p, d->body, o, d->common, depth + 1);
  aici_buf_puts(o, ")");
}

static void term_regex(lp_t *p, ex_t *e, aici_buf_t *o, bool common, uint32_t depth) {
  if (p->err) return;
  p->line = e->line;
  switch (e->kind) {
    case E_EMPTY: aici_buf_puts(o, "(?:)"); return;
    case E_SPECIAL: p->err = gr_fmt("line %u: special tokens cannot be used inside terminals", e->line); return;
    case E_JSON: p->err = gr_fmt("line %u: %%json cannot be used inside terminals", e->line); return;
    case E_STR: gr_regex_literal(o, (const uint8_t *)e->s, e->slen, e->icase); return;
    case E_RANGE: gr_regex_cp_range(o, e->lo, e->hi); return;
    case E_RE: {
      const char *why = 0;
      if (!gr_regex_translate(o, e->s, e->slen, e->icase, e->dotall, &why))
        p->err = gr_fmt("line %u: /%.*s/: %s", e->line, (int)e->slen, e->s, why);
      return;
    }
    case E_NAME: {
      def_t *d = find_def(p, e->s, e->slen, common);
      if (p->err) return;
      if (!d) { p->err = gr_fmt("line %u: undefined terminal %.*s", e->line, (int)e->slen, e->s); return; }
      if (!d->term) { p->err = gr_fmt("line %u: a terminal cannot use rule %.*s", e->line, (int)e->slen, e->s); return; }
      def_regex(p, d, o, depth);
      return;
    }
    case E_SEQ:
      aici_buf_puts(o, "(?:");
      for (uint32_t k = 0; k < e->n; k++) term_regex(p, e->kids[k], o, common, depth);
      aici_buf_puts(o, ")");
      return;
    case E_ALT:
      aici_buf_puts(o, "(?:");
      for (uint32_t k = 0; k < e->n; k++) { if (k) aici_buf_puts(o, "|"); term_regex(p, e->kids[k], o, common, depth); }
      aici_buf_puts(o, ")");
      return;
    case E_REP: {
      if (e->min > 1000 || (e->max != UINT32_MAX && e->max > 1000)) { p->err = gr_fmt("line %u: repeat count over 1000 in a terminal", e->line); return; }
      aici_buf_puts(o, "(?:");
      term_regex(p, e->kids[0], o, common, depth);
      aici_buf_puts(o, ")");
      char *q = e->max == UINT32_MAX ? gr_fmt("{%u,}", e->min) : gr_fmt("{%u,%u}", e->min, e->max);
      aici_buf_puts(o, q);
      aici_free(q);
      return;
    }
  }
}

static uint32_t lower(lp_t *p, ex_t *e);

static uint32_t anon_term(lp_t *p, ex_t *e) {
  aici_buf_t o = {0};
  term_regex(p, e, &o, false, 0);
  if (p->err) return 0;
  char *name = e->kind == E_STR ? gr_fmt("\"%.*s\"", (int)e->slen, e->s) : gr_fmt("/%.*s/", (int)(e->slen < 40 ? e->slen : 40), e->s ? e->s : "");
  uint32_t t = gr_add_term(p->g, name, (uint32_t)__builtin_strlen(name), o.p, o.n, false);
  aici_free(name);
  aici_free(o.p);
  return t;
}

static uint32_t special_term(lp_t *p, ex_t *e) {
  const char *s = e->s;
  uint32_t n = e->slen;
  if (n >= 4 && s[1] == '[' && s[n - 2] == ']') {   /* <[...]> */
    uint32_t *r = aici_malloc(8 * (n + 2)), nr = 0, i = 2, end = n - 2;
    bool neg = i < end && s[i] == '^';
    if (neg) i++;
    if (i < end && s[i] == '*') { r[0] = 0, r[1] = 0xFFFFFF, nr = 1, i++; }
    while (i < end) {
      uint32_t lo = 0, hi, k = i;
      while (i < end && s[i] >= '0' && s[i] <= '9') lo = lo * 10 + (uint32_t)(s[i++] - '0');
      if (i == k || lo > 0xFFFFFF) { aici_free(r); p->err = gr_fmt("line %u: bad token id in %.*s", e->line, (int)n, s); return 0; }
      hi = lo;
      if (i < end && s[i] == '-') {
        i++;
        k = i, hi = 0;
        if (i + 3 <= end && !__builtin_memcmp(s + i, "MAX", 3)) { hi = 0xFFFFFF; i += 3; }
        else while (i < end && s[i] >= '0' && s[i] <= '9') hi = hi * 10 + (uint32_t)(s[i++] - '0');
        if (i == k || hi < lo) { aici_free(r); p->err = gr_fmt("line %u: bad token range in %.*s", e->line, (int)n, s); return 0; }
      }
      r[2 * nr] = lo, r[2 * nr + 1] = hi, nr++;
      if (i < end && s[i] == ',') i++;
      else if (i < end) { aici_free(r); p->err = gr_fmt("line %u: bad token list %.*s", e->line, (int)n, s); return 0; }
    }
    if (neg) {                         /* the complement within [0, 0xFFFFFF] (sorted input) */
      uint32_t *c = aici_malloc(8 * (nr + 2)), nc = 0, next = 0;
      for (uint32_t k = 0; k < nr; k++) {
        if (r[2 * k] > next) c[2 * nc] = next, c[2 * nc + 1] = r[2 * k] - 1, nc++;
        if (r[2 * k + 1] + 1 > next) next = r[2 * k + 1] + 1;
      }
      if (next <= 0xFFFFFF) c[2 * nc] = next, c[2 * nc + 1] = 0xFFFFFF, nc++;
      aici_free(r);
      r = c, nr = nc;
    }
    uint32_t t = gr_add_special(p->g, s, n, r, nr);
    aici_free(r);
    return t;
  }
  /* <|name|> / <name>: the name is the whole text, resolved against the tokenizer */
  return gr_add_special(p->g, s, n, 0, 0);
}

static uint32_t def_symbol(lp_t *p, def_t *d) {
  if (d->resolved) return d->sym;
  if (d->max_tokens == 1) {            /* max_tokens=0: no token, so only "" (llguidance) */
    uint32_t nt = gr_add_nt(p->g, d->name, d->nlen);
    gr_add_prod(p->g, nt, 0, 0);
    d->sym = nt | GR_NT, d->resolved = true;
    return d->sym;
  }
  if (d->term || d->lazy || d->max_tokens) {
    aici_buf_t o = {0};
    if (d->term) def_regex(p, d, &o, 0);
    else {                             /* foo[lazy]: <terminal expression> */
      aici_buf_puts(&o, "(?:");
      term_regex(p, d->body, &o, false, 0);
      aici_buf_puts(&o, ")");
      if (p->err) { aici_free(p->err); p->err = gr_fmt("line %u: lexeme options need a terminal body in rule %.*s", d->line, (int)d->nlen, d->name); }
    }
    if (d->stop && !p->err) {          /* lazy: the lexeme ends where body + stop first matches */
      aici_buf_puts(&o, "(?:");
      gr_regex_literal(&o, (const uint8_t *)d->stop->s, d->stop->slen, false);
      aici_buf_puts(&o, ")");
    }
    if (p->err) return 0;
    uint32_t t = gr_add_term(p->g, d->name, d->nlen, o.p, o.n, d->lazy || d->max_tokens);
    if (d->lazy) p->g->terms[t].lazy = true;
    if (d->max_tokens) p->g->terms[t].max_tokens = d->max_tokens - 1, p->g->has_max_tokens = true;
    if (d->stop) p->g->terms[t].stop = true;
    aici_free(o.p);
    d->sym = t, d->resolved = true;
    return t;
  }
  uint32_t nt = gr_add_nt(p->g, d->name, d->nlen);
  d->sym = nt | GR_NT, d->resolved = true;
  ex_t *b = d->body;
  if (b->kind == E_ALT)
    for (uint32_t k = 0; k < b->n; k++) {
      ex_t *alt = b->kids[k];
      uint32_t n = alt->kind == E_SEQ ? alt->n : alt->kind == E_EMPTY ? 0 : 1;
      uint32_t *syms = aici_malloc((n ? n : 1) * 4);
      for (uint32_t j = 0; j < n; j++) syms[j] = lower(p, alt->kind == E_SEQ ? alt->kids[j] : alt);
      gr_add_prod(p->g, nt, syms, n);
      aici_free(syms);
    }
  else {
    uint32_t n = b->kind == E_SEQ ? b->n : b->kind == E_EMPTY ? 0 : 1;
    uint32_t *syms = aici_malloc((n ? n : 1) * 4);
    for (uint32_t j = 0; j < n; j++) syms[j] = lower(p, b->kind == E_SEQ ? b->kids[j] : b);
    gr_add_prod(p->g, nt, syms, n);
    aici_free(syms);
  }
  return d->sym;
}

static uint32_t helper(lp_t *p) {
  char *name = gr_fmt("<helper %u>", p->n_helpers++);
  uint32_t nt = gr_add_nt(p->g, name, (uint32_t)__builtin_strlen(name));
  aici_free(name);
  return nt;
}

/* A symbol standing for expression `e` inside a rule. */
static uint32_t lower(lp_t *p, ex_t *e) {
  if (p->err) return 0;
  p->line = e->line;
  switch (e->kind) {
    case E_STR: case E_RE: case E_RANGE: return anon_term(p, e);
    case E_SPECIAL: return special_term(p, e);
    case E_JSON: {
      char *err = 0;
      uint32_t t = gr_add_json(p->g, e->s, e->slen, &err);
      if (t == UINT32_MAX) { p->err = gr_fmt("line %u: %%json: %s", e->line, err); return 0; }
      return t;
    }
    case E_NAME: {
      def_t *d = find_def(p, e->s, e->slen, false);
      if (p->err) return 0;
      if (!d) { p->err = gr_fmt("line %u: undefined %s %.*s", e->line, lk_is_term_name(e->s, e->slen) ? "terminal" : "rule", (int)e->slen, e->s); return 0; }
      return def_symbol(p, d);
    }
    case E_EMPTY: {
      uint32_t nt = helper(p);
      gr_add_prod(p->g, nt, 0, 0);
      return nt | GR_NT;
    }
    case E_SEQ: {
      uint32_t nt = helper(p), *syms = aici_malloc(e->n * 4);
      for (uint32_t k = 0; k < e->n; k++) syms[k] = lower(p, e->kids[k]);
      gr_add_prod(p->g, nt, syms, e->n);
      aici_free(syms);
      return nt | GR_NT;
    }
    case E_ALT: {
      uint32_t nt = helper(p);
      for (uint32_t k = 0; k < e->n; k++) {
        ex_t *a = e->kids[k];
        if (a->kind == E_SEQ) {
          uint32_t *syms = aici_malloc(a->n * 4);
          for (uint32_t j = 0; j < a->n; j++) syms[j] = lower(p, a->kids[j]);
          gr_add_prod(p->g, nt, syms, a->n);
          aici_free(syms);
        } else if (a->kind == E_EMPTY) gr_add_prod(p->g, nt, 0, 0);
        else { uint32_t s = lower(p, a); gr_add_prod(p->g, nt, &s, 1); }
      }
      return nt | GR_NT;
    }
    case E_REP: {
      uint32_t x = lower(p, e->kids[0]);
      if (p->err) return 0;
      /* X{min,max}: X^min then (max-min) optional copies (nested), or X* (left-recursive) */
      uint32_t tail;
      if (e->max == UINT32_MAX) {
        tail = helper(p);                /* T -> ε | T X */
        gr_add_prod(p->g, tail, 0, 0);
        uint32_t two[2] = {tail | GR_NT, x};
        gr_add_prod(p->g, tail, two, 2);
      } else {
        tail = helper(p);                /* T0 -> ε ; Tk -> ε | X T(k-1) */
        gr_add_prod(p->g, tail, 0, 0);
        for (uint32_t k = e->min; k < e->max; k++) {
          uint32_t t2 = helper(p);
          gr_add_prod(p->g, t2, 0, 0);
          uint32_t two[2] = {x, tail | GR_NT};
          gr_add_prod(p->g, t2, two, 2);
          tail = t2;
        }
      }
      uint32_t nt = helper(p), *syms = aici_malloc((e->min + 1) * 4);
      for (uint32_t k = 0; k < e->min; k++) syms[k] = x;
      syms[e->min] = tail | GR_NT;
      gr_add_prod(p->g, nt, syms, e->min + 1);
      aici_free(syms);
      return nt | GR_NT;
    }
  }
  return 0;
}

/* The common terminals (Lark's common.lark, written as llguidance reads it). */
static const char COMMON[] =
    "DIGIT: \"0\"..\"9\"\n"
    "HEXDIGIT: \"a\"..\"f\"|\"A\"..\"F\"|DIGIT\n"
    "INT: DIGIT+\n"
    "SIGNED_INT: [\"+\"|\"-\"] INT\n"
    "DECIMAL: INT \".\" INT? | \".\" INT\n"
    "_EXP: (\"e\"|\"E\") SIGNED_INT\n"
    "FLOAT: INT _EXP | DECIMAL _EXP?\n"
    "SIGNED_FLOAT: [\"+\"|\"-\"] FLOAT\n"
    "NUMBER: FLOAT | INT\n"
    "SIGNED_NUMBER: [\"+\"|\"-\"] NUMBER\n"
    "ESCAPED_STRING: /\"(?:[^\"\\\\]|\\\\.)*\"/\n"
    "LCASE_LETTER: \"a\"..\"z\"\n"
    "UCASE_LETTER: \"A\"..\"Z\"\n"
    "LETTER: UCASE_LETTER | LCASE_LETTER\n"
    "WORD: LETTER+\n"
    "CNAME: (\"_\"|LETTER) (\"_\"|LETTER|DIGIT)*\n"
    "WS_INLINE: (\" \"|/\\t/)+\n"
    "WS: /[ \\t\\f\\r\\n]/+\n"
    "CR: /\\r/\n"
    "LF: /\\n/\n"
    "NEWLINE: (CR? LF)+\n"
    "SH_COMMENT: /#[^\\n]*/\n"
    "CPP_COMMENT: /\\/\\/[^\\n]*/\n"
    "C_COMMENT: /\\/\\*(?:[^*]|\\*+[^*\\/])*\\*+\\//\n"
    "SQL_COMMENT: /--[^\\n]*/\n";

gr_grammar_t *gr_compile_lark(const char *text, uint32_t len, char **err) {
  lp_t p = {text, 0, len, 1};
  gr_grammar_t *g = aici_calloc(1, sizeof(gr_grammar_t));
  g->skip = -1;
  p.g = g;
  lk_parse_defs(&p, false);
  lp_t c = {COMMON, 0, sizeof COMMON - 1, 1};
  if (!p.err) {
    c.defs = p.defs, c.n_defs = p.n_defs, c.cap_defs = p.cap_defs;
    lk_parse_defs(&c, true);
    if (c.err) { p.err = gr_fmt("internal: common terminals: %s", c.err); }
    p.defs = c.defs, p.n_defs = c.n_defs, p.cap_defs = c.cap_defs;
  }
  def_t *start = p.err ? 0 : find_def(&p, "start", 5, false);
  if (!p.err && !start) p.err = gr_fmt("no 'start' rule");
  if (!p.err && start->term) p.err = gr_fmt("line %u: start must be a rule", start->line);
  if (!p.err) {
    uint32_t s = def_symbol(&p, start);
    g->start = s & ~GR_NT;
  }
  if (!p.err && p.n_ignores) {
    aici_buf_t o = {0};
    aici_buf_puts(&o, "(?:");
    for (uint32_t k = 0; k < p.n_ignores && !p.err; k++) {
      if (k) aici_buf_puts(&o, "|");
      term_regex(&p, p.ignores[k], &o, false, 0);
    }
    aici_buf_puts(&o, ")");
    if (!p.err) {
      g->skip = (int32_t)gr_add_term(g, "%ignore", 7, o.p, o.n, true);   /* its own lexeme */
    }
    aici_free(o.p);
  }
  if (!p.err) {
    /* every definition must be usable: resolve the unused ones too, for their errors */
    for (uint32_t k = 0; k < p.n_defs && !p.err; k++)
      if (!p.defs[k].common && !p.defs[k].resolved) def_symbol(&p, &p.defs[k]);
  }
  if (!p.err && !gr_finish(g, &p.err)) {}
  if (p.err) { *err = p.err; return 0; }
  return g;
}
