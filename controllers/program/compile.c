/* The program's JSON -> the NFA of program.h, in continuation-passing style: pc_build(F, cont)
 * returns the node that starts F and continues with node `cont` after it. Every refusal names
 * the JSON pointer of the element and why ("at /format/elements/1: regex: ..."); the wording is
 * the same as aicirt.program.validate's (tests/test_program_validate.py compares them). */
#include "compile_int.h"
static const char *here(const cx_t *c, uint32_t *n) {
  *n = c->plen ? c->plen : 1;
  return c->plen ? c->ptr : "/";
}

/* A copy of here(), NUL-terminated: for an error the controller reports later. */
char *pc_here_copy(const cx_t *c) {
  uint32_t n;
  const char *at = here(c, &n);
  char *s = aici_malloc(n + 1);
  __builtin_memcpy(s, at, n);
  s[n] = 0;
  return s;
}

bool pc_fail(cx_t *c, const char *why) {
  if (c->err) return false;
  aici_buf_t b = {0};
  uint32_t n;
  const char *at = here(c, &n);
  aici_buf_puts(&b, "at ");
  aici_buf_putn(&b, at, n);
  aici_buf_puts(&b, ": ");
  aici_buf_puts(&b, why);
  c->err = b.p;
  return false;
}

bool pc_failn(cx_t *c, const char *why, const char *s, uint32_t n) {
  aici_buf_t b = {0};
  aici_buf_puts(&b, why);
  aici_buf_putn(&b, s, n);
  bool r = pc_fail(c, b.p);
  aici_free(b.p);
  return r;
}

/* JSON pointer segments: push a key (escaped: ~0 ~1) or an index; pop restores the length */
uint32_t pc_push_key(cx_t *c, const char *k) {
  uint32_t old = c->plen;
  if (c->plen + 2 < sizeof c->ptr) c->ptr[c->plen++] = '/';
  for (; *k && c->plen + 3 < sizeof c->ptr; k++) {
    if (*k == '~' || *k == '/') c->ptr[c->plen++] = '~', c->ptr[c->plen++] = *k == '~' ? '0' : '1';
    else c->ptr[c->plen++] = *k;
  }
  return old;
}

uint32_t pc_push_idx(cx_t *c, uint32_t i) {
  uint32_t old = c->plen;
  char d[12];
  int n = 0;
  do d[n++] = (char)('0' + i % 10), i /= 10; while (i);
  if (c->plen + (uint32_t)n + 2 < sizeof c->ptr) {
    c->ptr[c->plen++] = '/';
    while (n) c->ptr[c->plen++] = d[--n];
  }
  return old;
}

uint32_t pc_node(cx_t *c, uint8_t kind) {
  program_t *p = c->p;
  if (p->n == MAX_NODES) return pc_fail(c, "the program is too large (over 65536 nodes)"), 0;
  if (p->n == p->cap_nodes) {
    p->cap_nodes = p->cap_nodes ? p->cap_nodes * 2 : 64;
    p->g = aici_realloc(p->g, p->cap_nodes * sizeof(gnode_t));
  }
  gnode_t *g = &p->g[p->n];
  __builtin_memset(g, 0, sizeof *g);
  g->kind = kind;
  g->temperature = c->temp, g->has_temperature = c->has_temp;
  return p->n++;
}

void pc_add_next(cx_t *c, uint32_t from, uint32_t to) {
  gnode_t *g = &c->p->g[from];
  g->next = aici_realloc(g->next, (g->n_next + 1) * 4);
  g->next[g->n_next++] = to;
}

uint32_t pc_edge(cx_t *c, uint8_t kind, uint32_t to) {
  uint32_t n = pc_node(c, kind);
  pc_add_next(c, n, to);
  return n;
}

uint32_t pc_lit(cx_t *c, const char *s, uint32_t n, uint32_t cont) {
  if (!n) return cont;
  uint32_t k = pc_edge(c, G_LIT, cont);
  gnode_t *g = &c->p->g[k];
  g->lit = aici_malloc(n);
  __builtin_memcpy(g->lit, s, n);
  g->lit_len = n;
  return k;
}

const jv_t *pc_field(cx_t *c, const jv_t *f, const char *key, uint8_t kind, bool required) {
  const jv_t *v = jv_get(f, key);
  if (!v) {
    if (required) {
      aici_buf_t b = {0};
      aici_buf_puts(&b, "missing \"");
      aici_buf_puts(&b, key);
      aici_buf_puts(&b, "\"");
      pc_fail(c, b.p);
      aici_free(b.p);
    }
    return 0;
  }
  bool ok = v->kind == kind || (kind == JV_TRUE && v->kind == JV_FALSE);
  if (!ok) {
    static const char *names[] = {"null", "a boolean", "a boolean", "a number", "a string", "an array", "an object"};
    uint32_t old = pc_push_key(c, key);
    aici_buf_t b = {0};
    aici_buf_puts(&b, "must be ");
    aici_buf_puts(&b, names[kind]);
    pc_fail(c, b.p);
    aici_free(b.p);
    c->plen = old;
    return 0;
  }
  return v;
}

bool pc_flag(cx_t *c, const jv_t *f, const char *key) {
  const jv_t *v = pc_field(c, f, key, JV_TRUE, false);
  return v && v->kind == JV_TRUE;
}

/* A non-negative integer field; `dflt` when absent (or null, as XGrammar writes "no limit"). */
bool pc_uint_field(cx_t *c, const jv_t *f, const char *key, int64_t dflt, int64_t lo, int64_t *out) {
  const jv_t *v = jv_get(f, key);
  *out = dflt;
  if (!v || v->kind == JV_NULL) return true;
  uint32_t old = pc_push_key(c, key);
  bool ok = v->kind == JV_NUM && jv_is_int(v) && v->num >= (double)lo && v->num <= 2147483647.0;
  if (!ok) {
    pc_fail(c, lo < 0 ? "must be an integer >= -1" : "must be a non-negative integer");
    c->plen = old;
    return false;
  }
  c->plen = old;
  *out = (int64_t)v->num;
  return true;
}


/* Strings of a list field ("excludes", "stop", "triggers", a tag's "end" list). */
bool pc_strings(cx_t *c, const jv_t *f, const char *key, const jv_t **out, bool nonempty_each) {
  const jv_t *v = jv_get(f, key);
  *out = 0;
  if (!v) return true;
  uint32_t old = pc_push_key(c, key);
  if (v->kind != JV_ARR) return pc_fail(c, "must be an array of strings");
  for (uint32_t i = 0; i < v->n; i++) {
    uint32_t o2 = pc_push_idx(c, i);
    if (v->items[i].kind != JV_STR) return pc_fail(c, "must be a string");
    if (nonempty_each && !v->items[i].n) return pc_fail(c, "must not be empty");
    c->plen = o2;
  }
  c->plen = old;
  *out = v;
  return true;
}

/* `or` of literals, then cont */
uint32_t pc_lits_or(cx_t *c, const jv_t *list, uint32_t cont) {
  if (list->n == 1) return pc_lit(c, list->items[0].s, list->items[0].n, cont);
  uint32_t e = pc_node(c, G_EPS);
  for (uint32_t i = 0; i < list->n; i++) pc_add_next(c, e, pc_lit(c, list->items[i].s, list->items[i].n, cont));
  return e;
}

/* Literals that may follow `n` (through epsilons): any_text excludes them, as XGrammar's any_text
 * inside a tag stops at the tag's end. */
static uint32_t inner(cx_t *c, const jv_t *f, const jv_t *type, uint32_t cont) {
  if (jv_str_is(type, "const_string")) {
    const jv_t *v = pc_field(c, f, "value", JV_STR, true);
    return v ? pc_lit(c, v->s, v->n, cont) : 0;
  }
  if (jv_str_is(type, "regex")) {
    const jv_t *v = pc_field(c, f, "pattern", JV_STR, true);
    if (!v) return 0;
    char *rerr = 0;
    aici_regex_t *re = aici_regex_compile_text(v->s, v->n, &rerr);
    if (!re) {
      uint32_t old = pc_push_key(c, "pattern");
      pc_failn(c, "regex: ", rerr ? rerr : "does not compile", rerr ? (uint32_t)__builtin_strlen(rerr) : 16);
      c->plen = old;
      return 0;
    }
    uint32_t k = pc_edge(c, G_RE, cont);
    c->p->g[k].re = re;
    return k;
  }
  if (jv_str_is(type, "json_schema")) return pc_json_leaf(c, f, cont);
  if (jv_str_is(type, "grammar")) {    /* XGrammar's field: the grammar's text (Lark or GBNF) */
    const jv_t *v = pc_field(c, f, "grammar", JV_STR, true);
    if (!v) return 0;
    char *gerr = 0;
    gr_grammar_t *gg = gr_compile(v->s, v->n, &gerr);
    if (!gg) {
      uint32_t old = pc_push_key(c, "grammar");
      pc_failn(c, "grammar: ", gerr ? gerr : "does not compile", gerr ? (uint32_t)__builtin_strlen(gerr) : 16);
      aici_free(gerr);
      c->plen = old;
      return 0;
    }
    uint32_t k = pc_edge(c, G_GRAM, cont);
    c->p->g[k].gram = gg;
    gram_init(&c->p->g[k]);
    return k;
  }
  if (jv_str_is(type, "any_text")) {
    int64_t mt;
    if (!pc_uint_field(c, f, "max_tokens", -1, 0, &mt)) return 0;
    if (jv_get(f, "max_chars") && jv_get(f, "max_chars")->kind != JV_NULL)
      return pc_push_key(c, "max_chars"), pc_fail(c, "max_chars is not supported (use max_tokens)"), 0;
    return pc_text_leaf(c, f, cont, 0, mt);
  }
  if (jv_str_is(type, "sequence")) {
    const jv_t *el = pc_field(c, f, "elements", JV_ARR, true);
    if (!el) return 0;
    uint32_t old = pc_push_key(c, "elements");
    uint32_t at = cont;
    for (uint32_t i = el->n; i-- > 0 && !c->err;) {
      uint32_t o2 = pc_push_idx(c, i);
      at = pc_build(c, &el->items[i], at);
      c->plen = o2;
    }
    c->plen = old;
    return at;
  }
  if (jv_str_is(type, "or")) {
    const jv_t *el = pc_field(c, f, "elements", JV_ARR, true);
    if (!el) return 0;
    if (!el->n) return pc_push_key(c, "elements"), pc_fail(c, "must not be empty"), 0;
    uint32_t e = pc_node(c, G_EPS), old = pc_push_key(c, "elements");
    for (uint32_t i = 0; i < el->n && !c->err; i++) {
      uint32_t o2 = pc_push_idx(c, i);
      uint32_t b = pc_build(c, &el->items[i], cont);
      if (!c->err) pc_add_next(c, e, b);
      c->plen = o2;
    }
    c->plen = old;
    return e;
  }
  bool is_opt = jv_str_is(type, "optional"), is_star = jv_str_is(type, "star"), is_plus = jv_str_is(type, "plus");
  if (is_opt || is_star || is_plus || jv_str_is(type, "repeat")) {
    const jv_t *content = pc_field(c, f, "content", JV_OBJ, true);
    if (!content) return 0;
    int64_t lo = is_plus ? 1 : 0, hi = is_opt ? 1 : -1;
    if (!is_opt && !is_star && !is_plus) {
      if (!jv_get(f, "min")) return pc_fail(c, "missing \"min\""), 0;
      if (!jv_get(f, "max")) return pc_fail(c, "missing \"max\""), 0;
      if (!pc_uint_field(c, f, "min", 0, 0, &lo) || !pc_uint_field(c, f, "max", -1, -1, &hi)) return 0;
    }
    return pc_repeat(c, content, lo, hi, cont);
  }
  if (jv_str_is(type, "tag")) return pc_tag(c, f, cont);
  if (jv_str_is(type, "triggered_tags")) return pc_triggered(c, f, cont);
  if (jv_str_is(type, "tags_with_separator")) return pc_with_separator(c, f, cont);
  if (jv_str_is(type, "token")) {
    const jv_t *t = jv_get(f, "token");
    if (!t) return pc_fail(c, "missing \"token\""), 0;
    uint32_t old = pc_push_key(c, "token");
    aici_token_t id;
    if (!pc_token_of(c, t, &id)) return 0;
    c->plen = old;
    return pc_tok_leaf(c, 0, false, id, cont);
  }
  if (jv_str_is(type, "exclude_token") || jv_str_is(type, "any_tokens")) {
    const jv_t *ex = jv_get(f, "exclude_tokens");
    if (ex && ex->kind != JV_ARR) return pc_push_key(c, "exclude_tokens"), pc_fail(c, "must be an array"), 0;
    if (jv_str_is(type, "exclude_token")) return pc_tok_leaf(c, ex, true, 0, cont);
    int64_t mt;
    if (!pc_uint_field(c, f, "max_tokens", -1, 0, &mt)) return 0;
    if (mt > 256) return pc_push_key(c, "max_tokens"), pc_fail(c, "any_tokens: max_tokens over 256"), 0;
    /* star (or at most mt copies) of one token */
    uint32_t tail = cont;
    if (mt < 0) {
      uint32_t loop = pc_node(c, G_EPS);
      pc_add_next(c, loop, pc_tok_leaf(c, ex, true, 0, loop));
      pc_add_next(c, loop, cont);
      return loop;
    }
    for (int64_t i = 0; i < mt && !c->err; i++) {
      uint32_t e = pc_node(c, G_EPS);
      pc_add_next(c, e, pc_tok_leaf(c, ex, true, 0, tail));
      pc_add_next(c, e, cont);
      tail = e;
    }
    return tail;
  }
  if (jv_str_is(type, "fork")) {
    const jv_t *br = pc_field(c, f, "branches", JV_ARR, true);
    if (!br) return 0;
    if (br->n < 1 || br->n > 16) return pc_push_key(c, "branches"), pc_fail(c, "must hold 1 to 16 formats"), 0;
    uint32_t k = pc_node(c, G_FORK), old = pc_push_key(c, "branches");
    for (uint32_t i = 0; i < br->n && !c->err; i++) {
      uint32_t o2 = pc_push_idx(c, i);
      uint32_t b = pc_build(c, &br->items[i], cont);
      if (!c->err) pc_add_next(c, k, b);
      c->plen = o2;
    }
    c->plen = old;
    if (!c->p->uses_fork) c->p->fork_ptr = pc_here_copy(c);
    c->p->uses_fork = true;
    return k;
  }
  if (jv_str_is(type, "backtrack")) return pc_backtrack_step(c, f, cont);
  if (jv_str_is(type, "wait")) {
    const jv_t *vars;
    if (!pc_strings(c, f, "vars", &vars, true)) return 0;
    if (!vars || !vars->n) return pc_fail(c, "missing \"vars\" (a non-empty list of variable names)"), 0;
    uint32_t k = pc_edge(c, G_WAIT, cont);
    gnode_t *g = &c->p->g[k];
    g->vars = aici_malloc(vars->n * sizeof(char *));
    g->n_vars = vars->n;
    for (uint32_t i = 0; i < vars->n; i++) {
      g->vars[i] = aici_malloc(vars->items[i].n + 1);
      __builtin_memcpy(g->vars[i], vars->items[i].s, vars->items[i].n);
      g->vars[i][vars->items[i].n] = 0;
    }
    return k;
  }
  if (type->kind != JV_STR) return pc_push_key(c, "type"), pc_fail(c, "must be a string"), 0;
  aici_buf_t b = {0};
  aici_buf_puts(&b, "unknown type \"");
  aici_buf_putn(&b, type->s, type->n);
  aici_buf_puts(&b, "\" (types: ");
  aici_buf_puts(&b, TYPES);
  aici_buf_puts(&b, ")");
  uint32_t old = pc_push_key(c, "type");
  pc_fail(c, b.p);
  c->plen = old;
  aici_free(b.p);
  return 0;
}

/* The keys any format may carry: name / capture (a variable), stop (strings that end it), temperature. */
uint32_t pc_build(cx_t *c, const jv_t *f, uint32_t cont) {
  if (c->err) return 0;
  if (f->kind != JV_OBJ) return pc_fail(c, "a format must be an object with a \"type\""), 0;
  const jv_t *type = jv_get(f, "type");
  if (!type) return pc_fail(c, "missing \"type\""), 0;
  float saved_t = c->temp;
  bool saved_h = c->has_temp;
  const jv_t *t = jv_get(f, "temperature");
  if (t) {
    if (t->kind != JV_NUM || t->num < 0 || t->num > 100)
      return pc_push_key(c, "temperature"), pc_fail(c, "must be a number from 0 to 100"), 0;
    c->temp = (float)t->num, c->has_temp = true;
  }
  const jv_t *stop;
  if (!pc_strings(c, f, "stop", &stop, true)) return 0;
  if (stop && !stop->n) stop = 0;
  uint32_t after = stop ? pc_lits_or(c, stop, cont) : cont;
  uint32_t slot = pc_cap_slot(c, f);
  if (c->err) return 0;
  if (slot != NO_POS) {
    after = pc_edge(c, G_CLOSE, after);
    c->p->g[after].cap = slot;
  }
  uint32_t start = inner(c, f, type, after);
  if (!c->err && slot != NO_POS) {
    start = pc_edge(c, G_OPEN, start);
    c->p->g[start].cap = slot;
  }
  const jv_t *lab = jv_get(f, "label");
  if (!c->err && lab) {                /* the label's start: where a backtrack to it cuts */
    start = pc_edge(c, G_OPEN, start);
    c->p->g[start].cap = pc_label_slot(c->p, lab->s, lab->n);
  }
  c->temp = saved_t, c->has_temp = saved_h;
  return start;
}

/* The static facts leaves need: whether only the end follows (masks may then use the leaf's own). */
static bool only_end(program_t *p, uint32_t n, uint32_t depth) {
  gnode_t *g = &p->g[n];
  if (g->kind == G_END) return true;
  if (depth > 64 || (g->kind != G_EPS && g->kind != G_OPEN && g->kind != G_CLOSE)) return false;
  for (uint32_t i = 0; i < g->n_next; i++)
    if (!only_end(p, g->next[i], depth + 1)) return false;
  return true;
}

bool program_compile(const char *text, uint32_t len, program_t *p, char **err) {
  const char *e = 0;
  uint32_t at = 0;
  __builtin_memset(p, 0, sizeof *p);
  cx_t c = {.p = p, .repeat_budget = 256};
  jv_t *root = jv_parse(text, len, &e, &at);
  if (!root) {
    aici_buf_t b = {0};
    aici_buf_puts(&b, "at /: not JSON: ");
    aici_buf_puts(&b, e);
    aici_buf_puts(&b, " at offset ");
    sb_uint(&b, at);
    *err = b.p;
    return false;
  }
  const jv_t *f = root;
  if (root->kind == JV_OBJ && jv_str_is(jv_get(root, "type"), "structural_tag")) {
    f = jv_get(root, "format");
    if (!f) return pc_fail(&c, "missing \"format\""), *err = c.err, false;
    pc_push_key(&c, "format");
  }
  pc_check_labels(&c, f);
  if (c.err) {
    *err = c.err;
    return false;
  }
  uint32_t end = pc_node(&c, G_END);
  p->start = pc_build(&c, f, end);
  if (c.err) {
    *err = c.err;
    return false;
  }
  for (uint32_t i = 0; i < p->n; i++) {
    uint8_t k = p->g[i].kind;
    if (k <= G_GRAM) p->g[i].tail_is_end = p->g[i].n_next == 1 && only_end(p, p->g[i].next[0], 0);
  }
  return true;
}
