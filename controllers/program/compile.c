/* The program's JSON -> the NFA of program.h, in continuation-passing style: build(F, cont)
 * returns the node that starts F and continues with node `cont` after it. Every refusal names
 * the JSON pointer of the element and why ("at /format/elements/1: regex: ..."); the wording is
 * the same as aicirt.program.validate's (tests/test_program_validate.py compares them). */
#include "program.h"

typedef struct {
  program_t *p;
  char *err;
  char ptr[512];
  uint32_t plen;
  float temp;
  bool has_temp;
  uint32_t repeat_budget;
} cx_t;

static const char *TYPES = "const_string, regex, json_schema, grammar, any_text, sequence, or, optional, star, "
                           "plus, repeat, tag, triggered_tags, tags_with_separator, token, exclude_token, any_tokens, "
                           "fork, wait, backtrack";

/* The JSON pointer of the element being compiled ("/" at the root), as text of `*n` bytes. */
static const char *here(const cx_t *c, uint32_t *n) {
  *n = c->plen ? c->plen : 1;
  return c->plen ? c->ptr : "/";
}

/* A copy of here(), NUL-terminated: for an error the controller reports later. */
static char *here_copy(const cx_t *c) {
  uint32_t n;
  const char *at = here(c, &n);
  char *s = aici_malloc(n + 1);
  __builtin_memcpy(s, at, n);
  s[n] = 0;
  return s;
}

static bool fail(cx_t *c, const char *why) {
  if (c->err) return false;
  sb_t b = {0};
  uint32_t n;
  const char *at = here(c, &n);
  sb_puts(&b, "at ");
  sb_putn(&b, at, n);
  sb_puts(&b, ": ");
  sb_puts(&b, why);
  c->err = b.p;
  return false;
}

static bool failn(cx_t *c, const char *why, const char *s, uint32_t n) {
  sb_t b = {0};
  sb_puts(&b, why);
  sb_putn(&b, s, n);
  bool r = fail(c, b.p);
  aici_free(b.p);
  return r;
}

/* JSON pointer segments: push a key (escaped: ~0 ~1) or an index; pop restores the length */
static uint32_t push_key(cx_t *c, const char *k) {
  uint32_t old = c->plen;
  if (c->plen + 2 < sizeof c->ptr) c->ptr[c->plen++] = '/';
  for (; *k && c->plen + 3 < sizeof c->ptr; k++) {
    if (*k == '~' || *k == '/') c->ptr[c->plen++] = '~', c->ptr[c->plen++] = *k == '~' ? '0' : '1';
    else c->ptr[c->plen++] = *k;
  }
  return old;
}

static uint32_t push_idx(cx_t *c, uint32_t i) {
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

static uint32_t node(cx_t *c, uint8_t kind) {
  program_t *p = c->p;
  if (p->n == MAX_NODES) return fail(c, "the program is too large (over 65536 nodes)"), 0;
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

static void add_next(cx_t *c, uint32_t from, uint32_t to) {
  gnode_t *g = &c->p->g[from];
  g->next = aici_realloc(g->next, (g->n_next + 1) * 4);
  g->next[g->n_next++] = to;
}

static uint32_t edge(cx_t *c, uint8_t kind, uint32_t to) {
  uint32_t n = node(c, kind);
  add_next(c, n, to);
  return n;
}

static uint32_t lit(cx_t *c, const char *s, uint32_t n, uint32_t cont) {
  if (!n) return cont;
  uint32_t k = edge(c, G_LIT, cont);
  gnode_t *g = &c->p->g[k];
  g->lit = aici_malloc(n);
  __builtin_memcpy(g->lit, s, n);
  g->lit_len = n;
  return k;
}

static const jv_t *field(cx_t *c, const jv_t *f, const char *key, uint8_t kind, bool required) {
  const jv_t *v = jv_get(f, key);
  if (!v) {
    if (required) {
      sb_t b = {0};
      sb_puts(&b, "missing \"");
      sb_puts(&b, key);
      sb_puts(&b, "\"");
      fail(c, b.p);
      aici_free(b.p);
    }
    return 0;
  }
  bool ok = v->kind == kind || (kind == JV_TRUE && v->kind == JV_FALSE);
  if (!ok) {
    static const char *names[] = {"null", "a boolean", "a boolean", "a number", "a string", "an array", "an object"};
    uint32_t old = push_key(c, key);
    sb_t b = {0};
    sb_puts(&b, "must be ");
    sb_puts(&b, names[kind]);
    fail(c, b.p);
    aici_free(b.p);
    c->plen = old;
    return 0;
  }
  return v;
}

static bool flag(cx_t *c, const jv_t *f, const char *key) {
  const jv_t *v = field(c, f, key, JV_TRUE, false);
  return v && v->kind == JV_TRUE;
}

/* A non-negative integer field; `dflt` when absent (or null, as XGrammar writes "no limit"). */
static bool uint_field(cx_t *c, const jv_t *f, const char *key, int64_t dflt, int64_t lo, int64_t *out) {
  const jv_t *v = jv_get(f, key);
  *out = dflt;
  if (!v || v->kind == JV_NULL) return true;
  uint32_t old = push_key(c, key);
  bool ok = v->kind == JV_NUM && jv_is_int(v) && v->num >= (double)lo && v->num <= 2147483647.0;
  if (!ok) {
    fail(c, lo < 0 ? "must be an integer >= -1" : "must be a non-negative integer");
    c->plen = old;
    return false;
  }
  c->plen = old;
  *out = (int64_t)v->num;
  return true;
}

static uint32_t build(cx_t *c, const jv_t *f, uint32_t cont);

/* Strings of a list field ("excludes", "stop", "triggers", a tag's "end" list). */
static bool strings(cx_t *c, const jv_t *f, const char *key, const jv_t **out, bool nonempty_each) {
  const jv_t *v = jv_get(f, key);
  *out = 0;
  if (!v) return true;
  uint32_t old = push_key(c, key);
  if (v->kind != JV_ARR) return fail(c, "must be an array of strings");
  for (uint32_t i = 0; i < v->n; i++) {
    uint32_t o2 = push_idx(c, i);
    if (v->items[i].kind != JV_STR) return fail(c, "must be a string");
    if (nonempty_each && !v->items[i].n) return fail(c, "must not be empty");
    c->plen = o2;
  }
  c->plen = old;
  *out = v;
  return true;
}

/* `or` of literals, then cont */
static uint32_t lits_or(cx_t *c, const jv_t *list, uint32_t cont) {
  if (list->n == 1) return lit(c, list->items[0].s, list->items[0].n, cont);
  uint32_t e = node(c, G_EPS);
  for (uint32_t i = 0; i < list->n; i++) add_next(c, e, lit(c, list->items[i].s, list->items[i].n, cont));
  return e;
}

/* Literals that may follow `n` (through epsilons): any_text excludes them, as XGrammar's any_text
 * inside a tag stops at the tag's end. */
static void following_lits(program_t *p, uint32_t n, sb_t *out, uint32_t *count, uint32_t depth) {
  if (depth > 32 || *count >= 64) return;
  gnode_t *g = &p->g[n];
  if (g->kind == G_LIT) {
    uint32_t len = g->lit_len;
    sb_putn(out, (const char *)&len, 4);
    sb_putn(out, (const char *)g->lit, len);
    (*count)++;
  } else if (g->kind == G_EPS || g->kind == G_OPEN || g->kind == G_CLOSE) {
    for (uint32_t i = 0; i < g->n_next; i++) following_lits(p, g->next[i], out, count, depth + 1);
  }
}

/* Aho-Corasick automaton over the excluded strings (packed as len:u32, bytes), full goto table. */
static bool build_ac(cx_t *c, ac_t *ac, const sb_t *pats, uint32_t count) {
  uint32_t total = 1;
  for (uint32_t off = 0, k = 0; k < count; k++) {
    uint32_t len;
    __builtin_memcpy(&len, pats->p + off, 4);
    total += len, off += 4 + len;
  }
  if (total > 4096) return fail(c, "any_text: excluded strings over 4096 bytes in all");
  uint32_t n = total + 1;              /* state 0 dead, 1 root */
  uint32_t *go = aici_calloc((size_t)n * 256, 4);
  uint32_t *fl = aici_calloc(n, 4);
  uint8_t *hit = aici_calloc(n, 1);
  uint32_t used = 2;
  for (uint32_t off = 0, k = 0; k < count; k++) {
    uint32_t len, s = 1;
    __builtin_memcpy(&len, pats->p + off, 4);
    const uint8_t *b = (const uint8_t *)pats->p + off + 4;
    for (uint32_t i = 0; i < len; i++) {
      if (!go[s * 256 + b[i]]) go[s * 256 + b[i]] = used++;
      s = go[s * 256 + b[i]];
    }
    if (len) hit[s] = 1;
    off += 4 + len;
  }
  /* BFS: failure links, completed goto */
  uint32_t *q = aici_malloc(n * 4), qh = 0, qt = 0;
  for (int b = 0; b < 256; b++) {
    uint32_t t = go[256 + b];
    if (t) fl[t] = 1, q[qt++] = t;
    else go[256 + b] = 1;
  }
  while (qh < qt) {
    uint32_t s = q[qh++];
    hit[s] |= hit[fl[s]];
    for (int b = 0; b < 256; b++) {
      uint32_t t = go[s * 256 + b];
      if (t) fl[t] = go[fl[s] * 256 + b], q[qt++] = t;
      else go[s * 256 + b] = go[fl[s] * 256 + b];
    }
  }
  aici_free(q);
  aici_free(fl);
  ac->nodes = n, ac->go = go, ac->hit = hit;
  return true;
}

static uint32_t text_leaf(cx_t *c, const jv_t *f, uint32_t cont, const jv_t *extra, int64_t max_tokens) {
  const jv_t *ex;
  if (!strings(c, f, "excludes", &ex, true)) return 0;
  uint32_t k = edge(c, G_TEXT, cont);
  sb_t pats = {0};
  uint32_t count = 0;
  const jv_t *lists[2] = {ex, extra};
  for (int l = 0; l < 2; l++)
    for (uint32_t i = 0; lists[l] && i < lists[l]->n; i++) {
      uint32_t len = lists[l]->items[i].n;
      sb_putn(&pats, (const char *)&len, 4);
      sb_putn(&pats, lists[l]->items[i].s, len);
      count++;
    }
  following_lits(c->p, cont, &pats, &count, 0);
  gnode_t *g = &c->p->g[k];
  g->max_tokens = max_tokens < 0 ? UINT32_MAX : (uint32_t)max_tokens;
  ac_t ac = {0};
  bool ok = build_ac(c, &ac, &pats, count);
  aici_free(pats.p);
  if (!ok) return 0;
  c->p->g[k].ac = ac;
  return k;
}

static uint32_t json_leaf(cx_t *c, const jv_t *f, uint32_t cont) {
  const jv_t *s = jv_get(f, "json_schema");
  if (!s) return fail(c, "missing \"json_schema\""), 0;
  uint32_t old = push_key(c, "json_schema");
  const jv_t *schema = s;
  if (s->kind == JV_STR) {             /* XGrammar also takes the schema as JSON text */
    const char *e = 0;
    uint32_t at = 0;
    schema = jv_parse(s->s, s->n, &e, &at);
    if (!schema) return fail(c, "not JSON"), 0;
  } else if (s->kind != JV_OBJ && s->kind != JV_TRUE) {
    return fail(c, "must be an object (a JSON Schema)"), 0;
  }
  const jv_t *style = jv_get(f, "style");
  if (style && !jv_str_is(style, "json")) {
    c->plen = old;
    push_key(c, "style");
    return fail(c, "only style \"json\" is supported"), 0;
  }
  json_opts_t o = {0};
  const jv_t *ws = jv_get(f, "x-whitespace");
  if (ws && ws->kind == JV_NUM && jv_is_int(ws) && ws->num >= 0 && ws->num <= 8) o.whitespace = (uint32_t)ws->num;
  const jv_t *co = jv_get(f, "x-coerce-one-of");  /* oneOf whose branches may overlap, as anyOf */
  o.coerce_one_of = co && co->kind == JV_TRUE;
  const jv_t *ao = jv_get(f, "x-any-order");      /* object keys in any order (the json controller's any_order) */
  o.any_order = ao && ao->kind == JV_TRUE;
  compiled_t cc = {0};
  char *cerr = 0;
  if (!schema_compile(schema, &o, &cc, &cerr)) {
    sb_t b = {0};
    sb_puts(&b, "json_schema: ");
    sb_puts(&b, cerr);
    fail(c, b.p);
    aici_free(b.p);
    return 0;
  }
  matcher_t *m = matcher_new(&cc, &cerr);
  if (!m) {
    sb_t b = {0};
    sb_puts(&b, "json_schema: ");
    sb_puts(&b, cerr);
    fail(c, b.p);
    aici_free(b.p);
    return 0;
  }
  c->plen = old;
  int64_t by;                          /* ours: the reply's length by which the document is complete */
  if (!uint_field(c, f, "complete_by", -1, 0, &by)) return 0;
  uint32_t k = edge(c, G_JSON, cont);
  c->p->g[k].json = m;
  c->p->g[k].max_tokens = by < 0 ? UINT32_MAX : (uint32_t)by;
  return k;
}

/* A token by id or by its text (which must tokenize to exactly one token). */
static bool token_of(cx_t *c, const jv_t *v, aici_token_t *out) {
  if (v->kind == JV_NUM && jv_is_int(v) && v->num >= 0 && v->num < (double)aici_vocab_size()) {
    *out = (aici_token_t)v->num;
    return true;
  }
  if (v->kind == JV_STR && v->n) {
    uint32_t n;
    aici_token_t *t = aici_tokenize(v->s, v->n, &n);
    bool one = t && n == 1;
    if (one) *out = t[0];
    aici_free(t);
    if (one) return true;
    return failn(c, "not one token in this tokenizer: ", v->s, v->n);
  }
  return fail(c, "a token is an id below the vocabulary size or its text");
}

static uint32_t tok_leaf(cx_t *c, const jv_t *list, bool exclude, aici_token_t single, uint32_t cont) {
  uint32_t k = edge(c, G_TOK, cont);
  aici_tokset_t *s = aici_tokset_new();
  if (exclude) {
    aici_tokset_fill(s);
    uint32_t old = push_key(c, "exclude_tokens");
    for (uint32_t i = 0; list && i < list->n; i++) {
      uint32_t o2 = push_idx(c, i);
      aici_token_t t;
      if (!token_of(c, &list->items[i], &t)) return 0;
      aici_tokset_deny(s, t);
      c->plen = o2;
    }
    c->plen = old;
  } else {
    aici_tokset_allow(s, single);
  }
  c->p->g[k].toks = s;
  return k;
}

static uint32_t tag(cx_t *c, const jv_t *f, uint32_t cont) {
  if (!jv_str_is(jv_get(f, "type"), "tag")) {
    const jv_t *t = jv_get(f, "type");
    if (t) {
      uint32_t old = push_key(c, "type");
      fail(c, "must be \"tag\"");
      c->plen = old;
      return 0;
    }
  }
  const jv_t *begin = jv_get(f, "begin"), *end = jv_get(f, "end"), *content = jv_get(f, "content");
  if (!begin) return fail(c, "missing \"begin\""), 0;
  if (!end) return fail(c, "missing \"end\""), 0;
  if (!content) return fail(c, "missing \"content\""), 0;
  uint32_t after = cont;
  uint32_t old = push_key(c, "end");
  if (end->kind == JV_STR) after = lit(c, end->s, end->n, cont);
  else if (end->kind == JV_ARR) {
    const jv_t *list;
    c->plen = old;
    if (!strings(c, f, "end", &list, false)) return 0;
    if (!list->n) return push_key(c, "end"), fail(c, "must not be empty"), 0;
    after = lits_or(c, list, cont);
  } else if (end->kind == JV_OBJ) after = build(c, end, cont);
  else return fail(c, "must be a string, a list of strings or a token format"), 0;
  c->plen = old;
  if (c->err) return 0;
  old = push_key(c, "content");
  uint32_t body = build(c, content, after);
  c->plen = old;
  if (c->err) return 0;
  old = push_key(c, "begin");
  uint32_t start;
  if (begin->kind == JV_STR) start = lit(c, begin->s, begin->n, body);
  else if (begin->kind == JV_OBJ) start = build(c, begin, body);
  else return fail(c, "must be a string or a token format"), 0;
  c->plen = old;
  return start;
}

/* The tags of triggered_tags / tags_with_separator, as alternatives continuing with `cont`. */
static uint32_t tags_or(cx_t *c, const jv_t *tags, uint32_t cont) {
  uint32_t e = node(c, G_EPS);
  uint32_t old = push_key(c, "tags");
  for (uint32_t i = 0; i < tags->n && !c->err; i++) {
    uint32_t o2 = push_idx(c, i);
    if (tags->items[i].kind != JV_OBJ) return fail(c, "must be a tag object"), 0;
    uint32_t t = tag(c, &tags->items[i], cont);
    if (!c->err) add_next(c, e, t);
    c->plen = o2;
  }
  c->plen = old;
  return e;
}

static uint32_t triggered(cx_t *c, const jv_t *f, uint32_t cont) {
  const jv_t *triggers, *tags = field(c, f, "tags", JV_ARR, true);
  if (!tags || !strings(c, f, "triggers", &triggers, true)) return 0;
  if (!triggers) return fail(c, "missing \"triggers\""), 0;
  if (!triggers->n) return push_key(c, "triggers"), fail(c, "must not be empty"), 0;
  if (!tags->n) return push_key(c, "tags"), fail(c, "must not be empty"), 0;
  bool at_least_one = flag(c, f, "at_least_one"), stop_after_first = flag(c, f, "stop_after_first");
  if (c->err) return 0;
  /* loop: free text (no trigger in it), then the end or a tag and the loop again */
  uint32_t loop = node(c, G_EPS), choice = node(c, G_EPS);
  uint32_t after_tag = stop_after_first ? cont : loop;
  uint32_t ts = tags_or(c, tags, after_tag);
  if (c->err) return 0;
  add_next(c, choice, cont);
  add_next(c, choice, ts);
  /* each tag's begin must start with a trigger */
  for (uint32_t i = 0; i < tags->n; i++) {
    const jv_t *b = jv_get(&tags->items[i], "begin");
    bool found = false;
    for (uint32_t k = 0; b && b->kind == JV_STR && k < triggers->n; k++)
      found |= b->n >= triggers->items[k].n && !__builtin_memcmp(b->s, triggers->items[k].s, triggers->items[k].n);
    if (!found) {
      uint32_t old = push_key(c, "tags");
      push_idx(c, i);
      push_key(c, "begin");
      fail(c, "does not start with any of the triggers");
      c->plen = old;
      return 0;
    }
  }
  uint32_t text = text_leaf(c, f, choice, triggers, -1);
  if (c->err) return 0;
  add_next(c, loop, text);
  return at_least_one ? ts : loop;
}

static uint32_t with_separator(cx_t *c, const jv_t *f, uint32_t cont) {
  const jv_t *tags = field(c, f, "tags", JV_ARR, true), *sep = field(c, f, "separator", JV_STR, true);
  if (!tags || !sep) return 0;
  if (!tags->n) return push_key(c, "tags"), fail(c, "must not be empty"), 0;
  bool at_least_one = flag(c, f, "at_least_one"), stop_after_first = flag(c, f, "stop_after_first");
  if (c->err) return 0;
  if (stop_after_first) {
    uint32_t ts = tags_or(c, tags, cont);
    if (at_least_one || c->err) return ts;
    uint32_t e = node(c, G_EPS);
    add_next(c, e, ts);
    add_next(c, e, cont);
    return e;
  }
  uint32_t more = node(c, G_EPS);    /* after a tag: the end, or the separator and another tag */
  uint32_t ts = tags_or(c, tags, more);
  if (c->err) return 0;
  add_next(c, more, cont);
  add_next(c, more, lit(c, sep->s, sep->n, ts));
  if (at_least_one) return ts;
  uint32_t e = node(c, G_EPS);
  add_next(c, e, ts);
  add_next(c, e, cont);
  return e;
}

static uint32_t repeat(cx_t *c, const jv_t *content, int64_t lo, int64_t hi, uint32_t cont) {
  if (hi >= 0 && hi < lo) return fail(c, "\"max\" is below \"min\""), 0;
  uint64_t copies = (uint64_t)lo + (hi < 0 ? 1 : (uint64_t)(hi - lo));
  if (copies > c->repeat_budget) return fail(c, "repeat: over 256 copies of the content in the program"), 0;
  c->repeat_budget -= (uint32_t)copies;
  uint32_t old = push_key(c, "content");
  uint32_t tail = cont;
  if (hi < 0) {                        /* content* */
    uint32_t loop = node(c, G_EPS);
    uint32_t body = build(c, content, loop);
    add_next(c, loop, body);
    add_next(c, loop, cont);
    tail = loop;
  } else {
    for (int64_t i = lo; i < hi && !c->err; i++) {   /* (content (content ...)?)? */
      uint32_t e = node(c, G_EPS);
      add_next(c, e, build(c, content, tail));
      add_next(c, e, cont);
      tail = e;
    }
  }
  for (int64_t i = 0; i < lo && !c->err; i++) tail = build(c, content, tail);
  c->plen = old;
  return tail;
}

static uint32_t cap_slot(cx_t *c, const jv_t *f) {
  const jv_t *name = jv_get(f, "name");
  if (!name) return NO_POS;
  uint32_t old = push_key(c, "name");
  if (name->kind != JV_STR || !name->n) return fail(c, "must be a non-empty string"), NO_POS;
  c->plen = old;
  const jv_t *mode = jv_get(f, "capture");
  bool append = false;
  if (mode) {
    old = push_key(c, "capture");
    if (jv_str_is(mode, "append")) append = true;
    else if (!jv_str_is(mode, "set")) return fail(c, "must be \"set\" or \"append\""), NO_POS;
    c->plen = old;
  }
  program_t *p = c->p;
  if (p->n_names == MAX_NAMES) return fail(c, "over 16 named elements in one program"), NO_POS;
  p->n_names++;
  p->caps[p->n_caps].label = false;
  p->caps[p->n_caps].name = aici_malloc(name->n + 1);
  __builtin_memcpy(p->caps[p->n_caps].name, name->s, name->n);
  p->caps[p->n_caps].name[name->n] = 0;
  p->caps[p->n_caps].append = append;
  return p->n_caps++;
}

/* The slot of label `name` (labels are given slots, in document order, by check_labels). */
static uint32_t label_slot(const program_t *p, const char *s, uint32_t n) {
  for (uint32_t i = 0; i < p->n_caps; i++)
    if (p->caps[i].label && __builtin_strlen(p->caps[i].name) == n && !__builtin_memcmp(p->caps[i].name, s, n)) return i;
  return NO_POS;
}

/* Labels and backtracks, in document order, before anything is built (a sequence is built back
 * to front): a label is a non-empty string, defined once; a backtrack names a label defined
 * before it. Malformed structure is left to build(). */
static void check_labels(cx_t *c, const jv_t *f) {
  if (c->err || !f || f->kind != JV_OBJ) return;
  program_t *p = c->p;
  const jv_t *lab = jv_get(f, "label");
  if (lab) {
    uint32_t old = push_key(c, "label");
    if (lab->kind != JV_STR || !lab->n) return (void)fail(c, "must be a non-empty string");
    if (label_slot(p, lab->s, lab->n) != NO_POS) return (void)failn(c, "label defined twice: ", lab->s, lab->n);
    if (p->n_labels == MAX_LABELS) return (void)fail(c, "over 8 labels in one program");
    c->plen = old;
    cap_t *k = &p->caps[p->n_caps++];
    p->n_labels++;
    k->label = true, k->append = false;
    k->name = aici_malloc(lab->n + 1);
    __builtin_memcpy(k->name, lab->s, lab->n);
    k->name[lab->n] = 0;
  }
  if (jv_str_is(jv_get(f, "type"), "backtrack")) {
    const jv_t *to = jv_get(f, "to");
    if (to && to->kind == JV_STR && label_slot(p, to->s, to->n) == NO_POS) {
      uint32_t old = push_key(c, "to");
      failn(c, "no label before this step is called ", to->s, to->n);
      c->plen = old;
    }
    return;
  }
  static const char *kids[] = {"begin", "content", "end"};
  for (uint32_t i = 0; i < 3; i++) {
    const jv_t *k = jv_get(f, kids[i]);
    uint32_t old = push_key(c, kids[i]);
    check_labels(c, k);
    c->plen = old;
  }
  static const char *lists[] = {"elements", "tags", "branches"};
  for (uint32_t i = 0; i < 3; i++) {
    const jv_t *l = jv_get(f, lists[i]);
    if (!l || l->kind != JV_ARR) continue;
    uint32_t old = push_key(c, lists[i]);
    for (uint32_t j = 0; j < l->n && !c->err; j++) {
      uint32_t o2 = push_idx(c, j);
      check_labels(c, &l->items[j]);
      c->plen = o2;
    }
    c->plen = old;
  }
}

/* {"type": "backtrack", "to": LABEL, "text": T}: T a string, or a list of strings and
 * {"var": NAME} (the variable's value when the step runs; unset: nothing). */
static uint32_t backtrack_step(cx_t *c, const jv_t *f, uint32_t cont) {
  const jv_t *to = field(c, f, "to", JV_STR, true);
  if (!to) return 0;
  const jv_t *text = jv_get(f, "text");
  uint32_t old = push_key(c, "text");
  jv_t one = {0};
  const jv_t *parts = text;
  if (text && text->kind == JV_STR) one.kind = JV_ARR, one.n = 1, one.items = (jv_t *)text, parts = &one;
  else if (text && text->kind != JV_ARR) return fail(c, "must be a string or a list of strings and {\"var\": NAME}"), 0;
  for (uint32_t i = 0; parts && i < parts->n; i++) {
    const jv_t *x = &parts->items[i];
    if (x->kind == JV_STR) continue;
    const jv_t *v = x->kind == JV_OBJ ? jv_get(x, "var") : 0;
    if (!v || v->kind != JV_STR || !v->n || x->n != 1) {
      push_idx(c, i);
      return fail(c, "must be a string or {\"var\": NAME} (a non-empty variable name)"), 0;
    }
  }
  c->plen = old;
  uint32_t k = edge(c, G_BT, cont);
  gnode_t *g = &c->p->g[k];
  g->cap = label_slot(c->p, to->s, to->n);
  if (g->cap == NO_POS) return push_key(c, "to"), failn(c, "no label before this step is called ", to->s, to->n), 0;
  uint32_t n = parts ? parts->n : 0;
  g->vars = aici_malloc((n ? n : 1) * sizeof(char *));
  g->part_len = aici_malloc((n ? n : 1) * 4);
  g->part_is_var = aici_malloc(n ? n : 1);
  g->n_vars = n;
  for (uint32_t i = 0; i < n; i++) {
    const jv_t *x = &parts->items[i];
    bool is_var = x->kind == JV_OBJ;
    const jv_t *s = is_var ? jv_get(x, "var") : x;
    g->vars[i] = aici_malloc(s->n + 1);
    __builtin_memcpy(g->vars[i], s->s, s->n);
    g->vars[i][s->n] = 0;
    g->part_len[i] = s->n, g->part_is_var[i] = is_var;
  }
  if (!c->p->uses_backtrack) c->p->backtrack_ptr = here_copy(c);
  c->p->uses_backtrack = true;
  return k;
}

static uint32_t inner(cx_t *c, const jv_t *f, const jv_t *type, uint32_t cont) {
  if (jv_str_is(type, "const_string")) {
    const jv_t *v = field(c, f, "value", JV_STR, true);
    return v ? lit(c, v->s, v->n, cont) : 0;
  }
  if (jv_str_is(type, "regex")) {
    const jv_t *v = field(c, f, "pattern", JV_STR, true);
    if (!v) return 0;
    char *rerr = 0;
    aici_regex_t *re = aici_regex_compile_text(v->s, v->n, &rerr);
    if (!re) {
      uint32_t old = push_key(c, "pattern");
      failn(c, "regex: ", rerr ? rerr : "does not compile", rerr ? (uint32_t)__builtin_strlen(rerr) : 16);
      c->plen = old;
      return 0;
    }
    uint32_t k = edge(c, G_RE, cont);
    c->p->g[k].re = re;
    return k;
  }
  if (jv_str_is(type, "json_schema")) return json_leaf(c, f, cont);
  if (jv_str_is(type, "grammar")) {    /* XGrammar's field: the grammar's text (Lark or GBNF) */
    const jv_t *v = field(c, f, "grammar", JV_STR, true);
    if (!v) return 0;
    char *gerr = 0;
    gr_grammar_t *gg = gr_compile(v->s, v->n, &gerr);
    if (!gg) {
      uint32_t old = push_key(c, "grammar");
      failn(c, "grammar: ", gerr ? gerr : "does not compile", gerr ? (uint32_t)__builtin_strlen(gerr) : 16);
      aici_free(gerr);
      c->plen = old;
      return 0;
    }
    uint32_t k = edge(c, G_GRAM, cont);
    c->p->g[k].gram = gg;
    gram_init(&c->p->g[k]);
    return k;
  }
  if (jv_str_is(type, "any_text")) {
    int64_t mt;
    if (!uint_field(c, f, "max_tokens", -1, 0, &mt)) return 0;
    if (jv_get(f, "max_chars") && jv_get(f, "max_chars")->kind != JV_NULL)
      return push_key(c, "max_chars"), fail(c, "max_chars is not supported (use max_tokens)"), 0;
    return text_leaf(c, f, cont, 0, mt);
  }
  if (jv_str_is(type, "sequence")) {
    const jv_t *el = field(c, f, "elements", JV_ARR, true);
    if (!el) return 0;
    uint32_t old = push_key(c, "elements");
    uint32_t at = cont;
    for (uint32_t i = el->n; i-- > 0 && !c->err;) {
      uint32_t o2 = push_idx(c, i);
      at = build(c, &el->items[i], at);
      c->plen = o2;
    }
    c->plen = old;
    return at;
  }
  if (jv_str_is(type, "or")) {
    const jv_t *el = field(c, f, "elements", JV_ARR, true);
    if (!el) return 0;
    if (!el->n) return push_key(c, "elements"), fail(c, "must not be empty"), 0;
    uint32_t e = node(c, G_EPS), old = push_key(c, "elements");
    for (uint32_t i = 0; i < el->n && !c->err; i++) {
      uint32_t o2 = push_idx(c, i);
      uint32_t b = build(c, &el->items[i], cont);
      if (!c->err) add_next(c, e, b);
      c->plen = o2;
    }
    c->plen = old;
    return e;
  }
  bool is_opt = jv_str_is(type, "optional"), is_star = jv_str_is(type, "star"), is_plus = jv_str_is(type, "plus");
  if (is_opt || is_star || is_plus || jv_str_is(type, "repeat")) {
    const jv_t *content = field(c, f, "content", JV_OBJ, true);
    if (!content) return 0;
    int64_t lo = is_plus ? 1 : 0, hi = is_opt ? 1 : -1;
    if (!is_opt && !is_star && !is_plus) {
      if (!jv_get(f, "min")) return fail(c, "missing \"min\""), 0;
      if (!jv_get(f, "max")) return fail(c, "missing \"max\""), 0;
      if (!uint_field(c, f, "min", 0, 0, &lo) || !uint_field(c, f, "max", -1, -1, &hi)) return 0;
    }
    return repeat(c, content, lo, hi, cont);
  }
  if (jv_str_is(type, "tag")) return tag(c, f, cont);
  if (jv_str_is(type, "triggered_tags")) return triggered(c, f, cont);
  if (jv_str_is(type, "tags_with_separator")) return with_separator(c, f, cont);
  if (jv_str_is(type, "token")) {
    const jv_t *t = jv_get(f, "token");
    if (!t) return fail(c, "missing \"token\""), 0;
    uint32_t old = push_key(c, "token");
    aici_token_t id;
    if (!token_of(c, t, &id)) return 0;
    c->plen = old;
    return tok_leaf(c, 0, false, id, cont);
  }
  if (jv_str_is(type, "exclude_token") || jv_str_is(type, "any_tokens")) {
    const jv_t *ex = jv_get(f, "exclude_tokens");
    if (ex && ex->kind != JV_ARR) return push_key(c, "exclude_tokens"), fail(c, "must be an array"), 0;
    if (jv_str_is(type, "exclude_token")) return tok_leaf(c, ex, true, 0, cont);
    int64_t mt;
    if (!uint_field(c, f, "max_tokens", -1, 0, &mt)) return 0;
    if (mt > 256) return push_key(c, "max_tokens"), fail(c, "any_tokens: max_tokens over 256"), 0;
    /* star (or at most mt copies) of one token */
    uint32_t tail = cont;
    if (mt < 0) {
      uint32_t loop = node(c, G_EPS);
      add_next(c, loop, tok_leaf(c, ex, true, 0, loop));
      add_next(c, loop, cont);
      return loop;
    }
    for (int64_t i = 0; i < mt && !c->err; i++) {
      uint32_t e = node(c, G_EPS);
      add_next(c, e, tok_leaf(c, ex, true, 0, tail));
      add_next(c, e, cont);
      tail = e;
    }
    return tail;
  }
  if (jv_str_is(type, "fork")) {
    const jv_t *br = field(c, f, "branches", JV_ARR, true);
    if (!br) return 0;
    if (br->n < 1 || br->n > 16) return push_key(c, "branches"), fail(c, "must hold 1 to 16 formats"), 0;
    uint32_t k = node(c, G_FORK), old = push_key(c, "branches");
    for (uint32_t i = 0; i < br->n && !c->err; i++) {
      uint32_t o2 = push_idx(c, i);
      uint32_t b = build(c, &br->items[i], cont);
      if (!c->err) add_next(c, k, b);
      c->plen = o2;
    }
    c->plen = old;
    if (!c->p->uses_fork) c->p->fork_ptr = here_copy(c);
    c->p->uses_fork = true;
    return k;
  }
  if (jv_str_is(type, "backtrack")) return backtrack_step(c, f, cont);
  if (jv_str_is(type, "wait")) {
    const jv_t *vars;
    if (!strings(c, f, "vars", &vars, true)) return 0;
    if (!vars || !vars->n) return fail(c, "missing \"vars\" (a non-empty list of variable names)"), 0;
    uint32_t k = edge(c, G_WAIT, cont);
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
  if (type->kind != JV_STR) return push_key(c, "type"), fail(c, "must be a string"), 0;
  sb_t b = {0};
  sb_puts(&b, "unknown type \"");
  sb_putn(&b, type->s, type->n);
  sb_puts(&b, "\" (types: ");
  sb_puts(&b, TYPES);
  sb_puts(&b, ")");
  uint32_t old = push_key(c, "type");
  fail(c, b.p);
  c->plen = old;
  aici_free(b.p);
  return 0;
}

/* The keys any format may carry: name / capture (a variable), stop (strings that end it), temperature. */
static uint32_t build(cx_t *c, const jv_t *f, uint32_t cont) {
  if (c->err) return 0;
  if (f->kind != JV_OBJ) return fail(c, "a format must be an object with a \"type\""), 0;
  const jv_t *type = jv_get(f, "type");
  if (!type) return fail(c, "missing \"type\""), 0;
  float saved_t = c->temp;
  bool saved_h = c->has_temp;
  const jv_t *t = jv_get(f, "temperature");
  if (t) {
    if (t->kind != JV_NUM || t->num < 0 || t->num > 100)
      return push_key(c, "temperature"), fail(c, "must be a number from 0 to 100"), 0;
    c->temp = (float)t->num, c->has_temp = true;
  }
  const jv_t *stop;
  if (!strings(c, f, "stop", &stop, true)) return 0;
  if (stop && !stop->n) stop = 0;
  uint32_t after = stop ? lits_or(c, stop, cont) : cont;
  uint32_t slot = cap_slot(c, f);
  if (c->err) return 0;
  if (slot != NO_POS) {
    after = edge(c, G_CLOSE, after);
    c->p->g[after].cap = slot;
  }
  uint32_t start = inner(c, f, type, after);
  if (!c->err && slot != NO_POS) {
    start = edge(c, G_OPEN, start);
    c->p->g[start].cap = slot;
  }
  const jv_t *lab = jv_get(f, "label");
  if (!c->err && lab) {                /* the label's start: where a backtrack to it cuts */
    start = edge(c, G_OPEN, start);
    c->p->g[start].cap = label_slot(c->p, lab->s, lab->n);
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
    sb_t b = {0};
    sb_puts(&b, "at /: not JSON: ");
    sb_puts(&b, e);
    sb_puts(&b, " at offset ");
    sb_uint(&b, at);
    *err = b.p;
    return false;
  }
  const jv_t *f = root;
  if (root->kind == JV_OBJ && jv_str_is(jv_get(root, "type"), "structural_tag")) {
    f = jv_get(root, "format");
    if (!f) return fail(&c, "missing \"format\""), *err = c.err, false;
    push_key(&c, "format");
  }
  check_labels(&c, f);
  if (c.err) {
    *err = c.err;
    return false;
  }
  uint32_t end = node(&c, G_END);
  p->start = build(&c, f, end);
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
