/* The program compiler's leaf formats and combinators (see compile_int.h): any_text with its
 * exclusions, json_schema, tokens, tags and triggered tags, separators, repeats, captures,
 * labels and backtrack steps. */
#include "compile_int.h"

static void following_lits(program_t *p, uint32_t n, aici_buf_t *out, uint32_t *count, uint32_t depth) {
  if (depth > 32 || *count >= 64) return;
  gnode_t *g = &p->g[n];
  if (g->kind == G_LIT) {
    uint32_t len = g->lit_len;
    aici_buf_putn(out, (const char *)&len, 4);
    aici_buf_putn(out, (const char *)g->lit, len);
    (*count)++;
  } else if (g->kind == G_EPS || g->kind == G_OPEN || g->kind == G_CLOSE) {
    for (uint32_t i = 0; i < g->n_next; i++) following_lits(p, g->next[i], out, count, depth + 1);
  }
}

/* Aho-Corasick automaton over the excluded strings (packed as len:u32, bytes), full goto table. */
static bool build_ac(cx_t *c, ac_t *ac, const aici_buf_t *pats, uint32_t count) {
  uint32_t total = 1;
  for (uint32_t off = 0, k = 0; k < count; k++) {
    uint32_t len;
    __builtin_memcpy(&len, pats->p + off, 4);
    total += len, off += 4 + len;
  }
  if (total > 4096) return pc_fail(c, "any_text: excluded strings over 4096 bytes in all");
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

uint32_t pc_text_leaf(cx_t *c, const jv_t *f, uint32_t cont, const jv_t *extra, int64_t max_tokens) {
  const jv_t *ex;
  if (!pc_strings(c, f, "excludes", &ex, true)) return 0;
  uint32_t k = pc_edge(c, G_TEXT, cont);
  aici_buf_t pats = {0};
  uint32_t count = 0;
  const jv_t *lists[2] = {ex, extra};
  for (int l = 0; l < 2; l++)
    for (uint32_t i = 0; lists[l] && i < lists[l]->n; i++) {
      uint32_t len = lists[l]->items[i].n;
      aici_buf_putn(&pats, (const char *)&len, 4);
      aici_buf_putn(&pats, lists[l]->items[i].s, len);
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

uint32_t pc_json_leaf(cx_t *c, const jv_t *f, uint32_t cont) {
  const jv_t *s = jv_get(f, "json_schema");
  if (!s) return pc_fail(c, "missing \"json_schema\""), 0;
  uint32_t old = pc_push_key(c, "json_schema");
  const jv_t *schema = s;
  if (s->kind == JV_STR) {             /* XGrammar also takes the schema as JSON text */
    const char *e = 0;
    uint32_t at = 0;
    schema = jv_parse(s->s, s->n, &e, &at);
    if (!schema) return pc_fail(c, "not JSON"), 0;
  } else if (s->kind != JV_OBJ && s->kind != JV_TRUE) {
    return pc_fail(c, "must be an object (a JSON Schema)"), 0;
  }
  const jv_t *style = jv_get(f, "style");
  if (style && !jv_str_is(style, "json")) {
    c->plen = old;
    pc_push_key(c, "style");
    return pc_fail(c, "only style \"json\" is supported"), 0;
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
  if (!schema_compile(schema, &o, &cc, &cerr)) return pc_failn(c, "json_schema: ", cerr, (uint32_t)__builtin_strlen(cerr)), 0;
  matcher_t *m = matcher_new(&cc, &cerr);
  if (!m) return pc_failn(c, "json_schema: ", cerr, (uint32_t)__builtin_strlen(cerr)), 0;
  c->plen = old;
  int64_t by;                          /* ours: the reply's length by which the document is complete */
  if (!pc_uint_field(c, f, "complete_by", -1, 0, &by)) return 0;
  uint32_t k = pc_edge(c, G_JSON, cont);
  c->p->g[k].json = m;
  c->p->g[k].max_tokens = by < 0 ? UINT32_MAX : (uint32_t)by;
  return k;
}

/* A token by id or by its text (which must tokenize to exactly one token). */
bool pc_token_of(cx_t *c, const jv_t *v, aici_token_t *out) {
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
    return pc_failn(c, "not one token in this tokenizer: ", v->s, v->n);
  }
  return pc_fail(c, "a token is an id below the vocabulary size or its text");
}

uint32_t pc_tok_leaf(cx_t *c, const jv_t *list, bool exclude, aici_token_t single, uint32_t cont) {
  uint32_t k = pc_edge(c, G_TOK, cont);
  aici_tokset_t *s = aici_tokset_new();
  if (exclude) {
    aici_tokset_fill(s);
    uint32_t old = pc_push_key(c, "exclude_tokens");
    for (uint32_t i = 0; list && i < list->n; i++) {
      uint32_t o2 = pc_push_idx(c, i);
      aici_token_t t;
      if (!pc_token_of(c, &list->items[i], &t)) return 0;
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

uint32_t pc_tag(cx_t *c, const jv_t *f, uint32_t cont) {
  if (!jv_str_is(jv_get(f, "type"), "tag")) {
    const jv_t *t = jv_get(f, "type");
    if (t) {
      uint32_t old = pc_push_key(c, "type");
      pc_fail(c, "must be \"tag\"");
      c->plen = old;
      return 0;
    }
  }
  const jv_t *begin = jv_get(f, "begin"), *end = jv_get(f, "end"), *content = jv_get(f, "content");
  if (!begin) return pc_fail(c, "missing \"begin\""), 0;
  if (!end) return pc_fail(c, "missing \"end\""), 0;
  if (!content) return pc_fail(c, "missing \"content\""), 0;
  uint32_t after = cont;
  uint32_t old = pc_push_key(c, "end");
  if (end->kind == JV_STR) after = pc_lit(c, end->s, end->n, cont);
  else if (end->kind == JV_ARR) {
    const jv_t *list;
    c->plen = old;
    if (!pc_strings(c, f, "end", &list, false)) return 0;
    if (!list->n) return pc_push_key(c, "end"), pc_fail(c, "must not be empty"), 0;
    after = pc_lits_or(c, list, cont);
  } else if (end->kind == JV_OBJ) after = pc_build(c, end, cont);
  else return pc_fail(c, "must be a string, a list of strings or a token format"), 0;
  c->plen = old;
  if (c->err) return 0;
  old = pc_push_key(c, "content");
  uint32_t body = pc_build(c, content, after);
  c->plen = old;
  if (c->err) return 0;
  old = pc_push_key(c, "begin");
  uint32_t start;
  if (begin->kind == JV_STR) start = pc_lit(c, begin->s, begin->n, body);
  else if (begin->kind == JV_OBJ) start = pc_build(c, begin, body);
  else return pc_fail(c, "must be a string or a token format"), 0;
  c->plen = old;
  return start;
}

/* The tags of triggered_tags / tags_with_separator, as alternatives continuing with `cont`. */
static uint32_t tags_or(cx_t *c, const jv_t *tags, uint32_t cont) {
  uint32_t e = pc_node(c, G_EPS);
  uint32_t old = pc_push_key(c, "tags");
  for (uint32_t i = 0; i < tags->n && !c->err; i++) {
    uint32_t o2 = pc_push_idx(c, i);
    if (tags->items[i].kind != JV_OBJ) return pc_fail(c, "must be a tag object"), 0;
    uint32_t t = pc_tag(c, &tags->items[i], cont);
    if (!c->err) pc_add_next(c, e, t);
    c->plen = o2;
  }
  c->plen = old;
  return e;
}

uint32_t pc_triggered(cx_t *c, const jv_t *f, uint32_t cont) {
  const jv_t *triggers, *tags = pc_field(c, f, "tags", JV_ARR, true);
  if (!tags || !pc_strings(c, f, "triggers", &triggers, true)) return 0;
  if (!triggers) return pc_fail(c, "missing \"triggers\""), 0;
  if (!triggers->n) return pc_push_key(c, "triggers"), pc_fail(c, "must not be empty"), 0;
  if (!tags->n) return pc_push_key(c, "tags"), pc_fail(c, "must not be empty"), 0;
  bool at_least_one = pc_flag(c, f, "at_least_one"), stop_after_first = pc_flag(c, f, "stop_after_first");
  if (c->err) return 0;
  /* loop: free text (no trigger in it), then the end or a tag and the loop again */
  uint32_t loop = pc_node(c, G_EPS), choice = pc_node(c, G_EPS);
  uint32_t after_tag = stop_after_first ? cont : loop;
  uint32_t ts = tags_or(c, tags, after_tag);
  if (c->err) return 0;
  pc_add_next(c, choice, cont);
  pc_add_next(c, choice, ts);
  /* each tag's begin must start with a trigger */
  for (uint32_t i = 0; i < tags->n; i++) {
    const jv_t *b = jv_get(&tags->items[i], "begin");
    bool found = false;
    for (uint32_t k = 0; b && b->kind == JV_STR && k < triggers->n; k++)
      found |= b->n >= triggers->items[k].n && !__builtin_memcmp(b->s, triggers->items[k].s, triggers->items[k].n);
    if (!found) {
      uint32_t old = pc_push_key(c, "tags");
      pc_push_idx(c, i);
      pc_push_key(c, "begin");
      pc_fail(c, "does not start with any of the triggers");
      c->plen = old;
      return 0;
    }
  }
  uint32_t text = pc_text_leaf(c, f, choice, triggers, -1);
  if (c->err) return 0;
  pc_add_next(c, loop, text);
  return at_least_one ? ts : loop;
}

uint32_t pc_with_separator(cx_t *c, const jv_t *f, uint32_t cont) {
  const jv_t *tags = pc_field(c, f, "tags", JV_ARR, true), *sep = pc_field(c, f, "separator", JV_STR, true);
  if (!tags || !sep) return 0;
  if (!tags->n) return pc_push_key(c, "tags"), pc_fail(c, "must not be empty"), 0;
  bool at_least_one = pc_flag(c, f, "at_least_one"), stop_after_first = pc_flag(c, f, "stop_after_first");
  if (c->err) return 0;
  if (stop_after_first) {
    uint32_t ts = tags_or(c, tags, cont);
    if (at_least_one || c->err) return ts;
    uint32_t e = pc_node(c, G_EPS);
    pc_add_next(c, e, ts);
    pc_add_next(c, e, cont);
    return e;
  }
  uint32_t more = pc_node(c, G_EPS);    /* after a tag: the end, or the separator and another tag */
  uint32_t ts = tags_or(c, tags, more);
  if (c->err) return 0;
  pc_add_next(c, more, cont);
  pc_add_next(c, more, pc_lit(c, sep->s, sep->n, ts));
  if (at_least_one) return ts;
  uint32_t e = pc_node(c, G_EPS);
  pc_add_next(c, e, ts);
  pc_add_next(c, e, cont);
  return e;
}

uint32_t pc_repeat(cx_t *c, const jv_t *content, int64_t lo, int64_t hi, uint32_t cont) {
  if (hi >= 0 && hi < lo) return pc_fail(c, "\"max\" is below \"min\""), 0;
  uint64_t copies = (uint64_t)lo + (hi < 0 ? 1 : (uint64_t)(hi - lo));
  if (copies > c->repeat_budget) return pc_fail(c, "repeat: over 256 copies of the content in the program"), 0;
  c->repeat_budget -= (uint32_t)copies;
  uint32_t old = pc_push_key(c, "content");
  uint32_t tail = cont;
  if (hi < 0) {                        /* content* */
    uint32_t loop = pc_node(c, G_EPS);
    uint32_t body = pc_build(c, content, loop);
    pc_add_next(c, loop, body);
    pc_add_next(c, loop, cont);
    tail = loop;
  } else {
    for (int64_t i = lo; i < hi && !c->err; i++) {   /* (content (content ...)?)? */
      uint32_t e = pc_node(c, G_EPS);
      pc_add_next(c, e, pc_build(c, content, tail));
      pc_add_next(c, e, cont);
      tail = e;
    }
  }
  for (int64_t i = 0; i < lo && !c->err; i++) tail = pc_build(c, content, tail);
  c->plen = old;
  return tail;
}

uint32_t pc_cap_slot(cx_t *c, const jv_t *f) {
  const jv_t *name = jv_get(f, "name");
  if (!name) return NO_POS;
  uint32_t old = pc_push_key(c, "name");
  if (name->kind != JV_STR || !name->n) return pc_fail(c, "must be a non-empty string"), NO_POS;
  c->plen = old;
  const jv_t *mode = jv_get(f, "capture");
  bool append = false;
  if (mode) {
    old = pc_push_key(c, "capture");
    if (jv_str_is(mode, "append")) append = true;
    else if (!jv_str_is(mode, "set")) return pc_fail(c, "must be \"set\" or \"append\""), NO_POS;
    c->plen = old;
  }
  program_t *p = c->p;
  if (p->n_names == MAX_NAMES) return pc_fail(c, "over 16 named elements in one program"), NO_POS;
  p->n_names++;
  p->caps[p->n_caps].label = false;
  p->caps[p->n_caps].name = aici_malloc(name->n + 1);
  __builtin_memcpy(p->caps[p->n_caps].name, name->s, name->n);
  p->caps[p->n_caps].name[name->n] = 0;
  p->caps[p->n_caps].append = append;
  return p->n_caps++;
}

/* The slot of label `name` (labels are given slots, in document order, by check_labels). */
uint32_t pc_label_slot(const program_t *p, const char *s, uint32_t n) {
  for (uint32_t i = 0; i < p->n_caps; i++)
    if (p->caps[i].label && __builtin_strlen(p->caps[i].name) == n && !__builtin_memcmp(p->caps[i].name, s, n)) return i;
  return NO_POS;
}

/* Labels and backtracks, in document order, before anything is built (a sequence is built back
 * to front): a label is a non-empty string, defined once; a backtrack names a label defined
 * before it. Malformed structure is left to pc_build(). */
void pc_check_labels(cx_t *c, const jv_t *f) {
  if (c->err || !f || f->kind != JV_OBJ) return;
  program_t *p = c->p;
  const jv_t *lab = jv_get(f, "label");
  if (lab) {
    uint32_t old = pc_push_key(c, "label");
    if (lab->kind != JV_STR || !lab->n) return (void)pc_fail(c, "must be a non-empty string");
    if (pc_label_slot(p, lab->s, lab->n) != NO_POS) return (void)pc_failn(c, "label defined twice: ", lab->s, lab->n);
    if (p->n_labels == MAX_LABELS) return (void)pc_fail(c, "over 8 labels in one program");
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
    if (to && to->kind == JV_STR && pc_label_slot(p, to->s, to->n) == NO_POS) {
      uint32_t old = pc_push_key(c, "to");
      pc_failn(c, "no label before this step is called ", to->s, to->n);
      c->plen = old;
    }
    return;
  }
  static const char *kids[] = {"begin", "content", "end"};
  for (uint32_t i = 0; i < 3; i++) {
    const jv_t *k = jv_get(f, kids[i]);
    uint32_t old = pc_push_key(c, kids[i]);
    pc_check_labels(c, k);
    c->plen = old;
  }
  static const char *lists[] = {"elements", "tags", "branches"};
  for (uint32_t i = 0; i < 3; i++) {
    const jv_t *l = jv_get(f, lists[i]);
    if (!l || l->kind != JV_ARR) continue;
    uint32_t old = pc_push_key(c, lists[i]);
    for (uint32_t j = 0; j < l->n && !c->err; j++) {
      uint32_t o2 = pc_push_idx(c, j);
      pc_check_labels(c, &l->items[j]);
      c->plen = o2;
    }
    c->plen = old;
  }
}

/* {"type": "backtrack", "to": LABEL, "text": T}: T a string, or a list of strings and
 * {"var": NAME} (the variable's value when the step runs; unset: nothing). */
uint32_t pc_backtrack_step(cx_t *c, const jv_t *f, uint32_t cont) {
  const jv_t *to = pc_field(c, f, "to", JV_STR, true);
  if (!to) return 0;
  const jv_t *text = jv_get(f, "text");
  uint32_t old = pc_push_key(c, "text");
  jv_t one = {0};
  const jv_t *parts = text;
  if (text && text->kind == JV_STR) one.kind = JV_ARR, one.n = 1, one.items = (jv_t *)text, parts = &one;
  else if (text && text->kind != JV_ARR) return pc_fail(c, "must be a string or a list of strings and {\"var\": NAME}"), 0;
  for (uint32_t i = 0; parts && i < parts->n; i++) {
    const jv_t *x = &parts->items[i];
    if (x->kind == JV_STR) continue;
    const jv_t *v = x->kind == JV_OBJ ? jv_get(x, "var") : 0;
    if (!v || v->kind != JV_STR || !v->n || x->n != 1) {
      pc_push_idx(c, i);
      return pc_fail(c, "must be a string or {\"var\": NAME} (a non-empty variable name)"), 0;
    }
  }
  c->plen = old;
  uint32_t k = pc_edge(c, G_BT, cont);
  gnode_t *g = &c->p->g[k];
  g->cap = pc_label_slot(c->p, to->s, to->n);
  if (g->cap == NO_POS) return pc_push_key(c, "to"), pc_failn(c, "no label before this step is called ", to->s, to->n), 0;
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
  if (!c->p->uses_backtrack) c->p->backtrack_ptr = pc_here_copy(c);
  c->p->uses_backtrack = true;
  return k;
}
