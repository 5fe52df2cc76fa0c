/* grammar.c - the compiled grammar both front-ends build: terminals (regex text), nonterminals,
 * productions; gr_finish compiles the terminals and derives the parser's tables. */
#include "grammar.h"

#define WARM_DFA_STATES 512u           /* rows of each terminal's DFA built at compile (see gr_finish) */
#define WARM_DFA_TOTAL 2048u           /* ... and of all terminals' together (counted repeats make many: 1 KiB a row) */

char *gr_strdup(const char *s, uint32_t n) {
  char *p = aici_malloc(n + 1);
  __builtin_memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *gr_fmt(const char *fmt, ...) {
  aici_buf_t b = {0};
  __builtin_va_list ap;
  __builtin_va_start(ap, fmt);
  for (const char *f = fmt; *f; f++) {
    if (*f != '%') { aici_buf_putn(&b, f, 1); continue; }
    f++;
    if (*f == 's') { const char *s = __builtin_va_arg(ap, const char *); aici_buf_puts(&b, s ? s : "(null)"); }
    else if (f[0] == '.' && f[1] == '*' && f[2] == 's') {
      int n = __builtin_va_arg(ap, int);
      const char *s = __builtin_va_arg(ap, const char *);
      aici_buf_putn(&b, s, (uint32_t)n);
      f += 2;
    } else if (*f == 'u' || *f == 'd') {
      int64_t v = *f == 'u' ? (int64_t)__builtin_va_arg(ap, unsigned) : (int64_t)__builtin_va_arg(ap, int);
      if (v < 0) { aici_buf_putn(&b, "-", 1); v = -v; }
      char d[24]; int k = 0;
      do d[k++] = (char)('0' + v % 10); while (v /= 10);
      while (k) aici_buf_putn(&b, &d[--k], 1);
    } else if (*f == '%') aici_buf_putn(&b, "%", 1);
  }
  __builtin_va_end(ap);
  if (!b.p) aici_buf_putn(&b, "", 0);
  return b.p;
}

uint32_t gr_add_nt(gr_grammar_t *g, const char *name, uint32_t len) {
  if (g->n_nts == g->cap_nts) {
    g->cap_nts = g->cap_nts ? g->cap_nts * 2 : 32;
    g->nt_names = aici_realloc(g->nt_names, g->cap_nts * sizeof(char *));
  }
  g->nt_names[g->n_nts] = gr_strdup(name, len);
  return g->n_nts++;
}

uint32_t gr_add_term(gr_grammar_t *g, const char *name, uint32_t nlen, const char *regex, uint32_t rlen, bool unique) {
  for (uint32_t i = 0; i < g->n_terms && !unique; i++)   /* the same text is one lexeme (llguidance too) */
    if (!g->terms[i].unique && g->terms[i].token < 0 && g->terms[i].regex_len == rlen && !g->terms[i].lazy &&
        !__builtin_memcmp(g->terms[i].regex, regex, rlen))
      return i;
  if (g->n_terms == g->cap_terms) {
    g->cap_terms = g->cap_terms ? g->cap_terms * 2 : 32;
    g->terms = aici_realloc(g->terms, g->cap_terms * sizeof(gr_term_t));
  }
  gr_term_t *t = &g->terms[g->n_terms];
  __builtin_memset(t, 0, sizeof *t);
  t->name = gr_strdup(name, nlen);
  t->regex = gr_strdup(regex, rlen);
  t->regex_len = rlen;
  t->token = -1;
  t->unique = unique;
  return g->n_terms++;
}

uint32_t gr_add_special(gr_grammar_t *g, const char *name, uint32_t nlen, const uint32_t *ranges, uint32_t n_ranges) {
  for (uint32_t i = 0; i < g->n_terms; i++)
    if (g->terms[i].token >= 0 && !__builtin_memcmp(g->terms[i].name, name, nlen) && !g->terms[i].name[nlen]) return i;
  uint32_t t = gr_add_term(g, name, nlen, "", 0, true);
  gr_term_t *x = &g->terms[t];
  x->token = 0;
  if (ranges) {
    x->tok_ranges = aici_malloc(8 * n_ranges + 8);
    __builtin_memcpy(x->tok_ranges, ranges, 8 * n_ranges);
    x->n_tok_ranges = n_ranges;
  } else x->special_name = gr_strdup(name, nlen);
  return t;
}

uint32_t gr_add_json(gr_grammar_t *g, const char *schema, uint32_t len, char **err) {
  gr_json_t *j = gr_json_compile(schema, len, err);
  if (!j) return UINT32_MAX;
  char *name = gr_fmt("%%json#%u", g->n_terms);
  uint32_t t = gr_add_term(g, name, (uint32_t)__builtin_strlen(name), "", 0, true);
  aici_free(name);
  g->terms[t].json = j;
  return t;
}

void gr_add_prod(gr_grammar_t *g, uint32_t lhs, const uint32_t *syms, uint32_t n) {
  if (g->n_prods == g->cap_prods) {
    g->cap_prods = g->cap_prods ? g->cap_prods * 2 : 64;
    g->prods = aici_realloc(g->prods, g->cap_prods * sizeof(gr_prod_t));
  }
  gr_prod_t *p = &g->prods[g->n_prods++];
  p->lhs = lhs;
  p->n = n;
  p->syms = aici_malloc((n ? n : 1) * 4);
  __builtin_memcpy(p->syms, syms, n * 4);
}

bool gr_finish(gr_grammar_t *g, char **err) {
  /* augmented start S' -> start: its completion at origin 0 means "accepting" */
  uint32_t s0 = gr_add_nt(g, "<start>", 7), sym = g->start | GR_NT;
  gr_add_prod(g, s0, &sym, 1);
  g->start = s0;
  /* stable sort of productions by lhs (counting sort) */
  g->nt_first = aici_calloc(g->n_nts + 1, 4);
  g->nt_count = aici_calloc(g->n_nts, 4);
  for (uint32_t i = 0; i < g->n_prods; i++) g->nt_count[g->prods[i].lhs]++;
  for (uint32_t k = 0; k < g->n_nts; k++) g->nt_first[k + 1] = g->nt_first[k] + g->nt_count[k];
  gr_prod_t *sorted = aici_malloc((g->n_prods ? g->n_prods : 1) * sizeof(gr_prod_t));
  uint32_t *fill = aici_calloc(g->n_nts, 4);
  for (uint32_t i = 0; i < g->n_prods; i++) {
    uint32_t l = g->prods[i].lhs;
    sorted[g->nt_first[l] + fill[l]++] = g->prods[i];
  }
  aici_free(fill);
  aici_free(g->prods);
  g->prods = sorted;
  g->cap_prods = g->n_prods;
  g->start_prod = g->nt_first[s0];
  /* nullable: fixpoint */
  g->nullable = aici_calloc(g->n_nts, 1);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t i = 0; i < g->n_prods; i++) {
      gr_prod_t *p = &g->prods[i];
      if (g->nullable[p->lhs]) continue;
      bool all = true;
      for (uint32_t j = 0; j < p->n && all; j++)
        all = (p->syms[j] & GR_NT) && g->nullable[p->syms[j] & ~GR_NT];
      if (all) g->nullable[p->lhs] = changed = true;
    }
  }
  for (uint32_t k = 0; k < g->n_nts; k++)
    if (!g->nt_count[k]) { *err = gr_fmt("rule '%s' is used but not defined", g->nt_names[k]); return false; }
  /* productive (derives some finite string): fixpoint; a start that is not has no finite sentence,
   * which would only ever be cut by max_tokens: refused, naming the rules that never end */
  uint8_t *prod_ok = aici_calloc(g->n_nts, 1);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t i = 0; i < g->n_prods; i++) {
      gr_prod_t *p = &g->prods[i];
      if (prod_ok[p->lhs]) continue;
      bool all = true;
      for (uint32_t j = 0; j < p->n && all; j++)
        all = !(p->syms[j] & GR_NT) || prod_ok[p->syms[j] & ~GR_NT];
      if (all) prod_ok[p->lhs] = changed = true;
    }
  }
  if (!prod_ok[s0]) {
    /* the rules reachable from start that never end, named (up to three) */
    uint8_t *seen = aici_calloc(g->n_nts, 1);
    uint32_t *stack = aici_malloc(g->n_nts * 4), sp = 0, named = 0;
    char names[200] = {0};
    uint32_t nl = 0;
    stack[sp++] = s0, seen[s0] = 1;
    while (sp) {
      uint32_t nt = stack[--sp];
      if (nt != s0 && !prod_ok[nt] && named < 3) {
        const char *nm = g->nt_names[nt];
        if (nm[0] == 'g' && nm[1] == '-') nm += 2;   /* GBNF's rules, as written */
        uint32_t l = (uint32_t)__builtin_strlen(nm);
        if (nl + l + 5 < sizeof names) {
          if (named) names[nl++] = ',', names[nl++] = ' ';
          names[nl++] = '\'';
          __builtin_memcpy(names + nl, nm, l), nl += l;
          names[nl++] = '\'';
          named++;
        }
      }
      for (uint32_t i = g->nt_first[nt]; i < g->nt_first[nt] + g->nt_count[nt]; i++)
        for (uint32_t j = 0; j < g->prods[i].n; j++) {
          uint32_t y = g->prods[i].syms[j];
          if ((y & GR_NT) && !seen[y & ~GR_NT] && !prod_ok[y & ~GR_NT]) seen[y & ~GR_NT] = 1, stack[sp++] = y & ~GR_NT;
        }
    }
    names[nl] = 0;
    *err = gr_fmt("the grammar has no finite sentence: rule%s %s never end%s (every alternative needs a rule that never ends)",
                  named > 1 ? "s" : "", names, named > 1 ? "" : "s");
    aici_free(seen), aici_free(stack), aici_free(prod_ok);
    return false;
  }
  aici_free(prod_ok);
  uint32_t warm = WARM_DFA_TOTAL;
  for (uint32_t i = 0; i < g->n_terms; i++) {
    gr_term_t *t = &g->terms[i];
    if (t->token >= 0 && t->special_name) {   /* <|name|>: one token without bytes */
      uint32_t n = 0, blen = 0;
      aici_token_t *ids = aici_tokenize(t->special_name, __builtin_strlen(t->special_name), &n);
      const uint8_t *b = n == 1 ? aici_token_bytes(ids[0], &blen) : 0;
      if (n != 1 || (b && blen)) {
        *err = gr_fmt("special token %s: not a special token of this tokenizer", t->special_name);
        return false;
      }
      t->tok_ranges = aici_malloc(8);
      t->tok_ranges[0] = t->tok_ranges[1] = ids[0];
      t->n_tok_ranges = 1;
      aici_free(ids);
    }
    if (t->token >= 0 || t->json) continue;
    char *e = 0;
    t->re = aici_regex_compile(t->regex, t->regex_len, &e);
    if (!t->re) { *err = gr_fmt("terminal %s: %s", t->name, e); return false; }
    /* The DFA's first rows built now, in the compiling sequence: its forks (every request of a
     * prepared grammar, every branch) share them instead of each building them in its first
     * masks. States are numbered as they are made, breadth first from the start state. */
    for (uint32_t d = aici_regex_start(t->re); d < aici_regex_num_states(t->re) && d <= WARM_DFA_STATES && warm; d++, warm--)
      aici_regex_step(t->re, d, 0);
  }
  return true;
}

gr_grammar_t *gr_compile(const char *text, uint32_t len, char **err) {
  /* GBNF: the first definition line has `::=` */
  uint32_t i = 0;
  while (i < len) {
    uint32_t e = i;
    while (e < len && text[e] != '\n') e++;
    uint32_t k = i;
    while (k < e && (text[k] == ' ' || text[k] == '\t' || text[k] == '\r')) k++;
    if (k < e && text[k] != '#' && !(text[k] == '/' && k + 1 < e && text[k + 1] == '/')) {
      for (uint32_t j = k; j + 2 < e + 1 && j + 2 < len; j++)
        if (text[j] == ':' && text[j + 1] == ':' && text[j + 2] == '=') return gr_compile_gbnf(text, len, err);
      break;
    }
    i = e + 1;
  }
  return gr_compile_lark(text, len, err);
}
