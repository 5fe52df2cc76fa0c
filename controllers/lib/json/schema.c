/* JSON Schema -> regex texts for the SDK's DFA engine, one per machine (see json.h).
 *
 * Every keyword is either enforced exactly, narrowed (the controller offers a subset of the
 * valid documents: canonical escapes, no exponent on bounded numbers, properties in schema
 * order), an annotation, or an error "unsupported: KEYWORD at POINTER". Words that are no JSON
 * Schema keyword at all (x-..., javaType) constrain nothing for any validator, so they are
 * skipped like annotations.
 */
#include "schema_int.h"

const jv_t FALSE_SCHEMA = {.kind = JV_FALSE};
const jv_t ANY_MARK = {.kind = JV_TRUE};
/* ---- errors and pointers --------------------------------------------------------------------- */
void sc_fail(cx_t *c, const char *what, const char *kw, const char *detail) {
  if (c->err) return;
  aici_buf_t m = {0};
  aici_buf_puts(&m, what);
  aici_buf_puts(&m, kw);
  aici_buf_puts(&m, " at ");
  aici_buf_puts(&m, c->ptr.n ? c->ptr.p : "#");
  if (detail) aici_buf_puts(&m, " ("), aici_buf_puts(&m, detail), aici_buf_putc(&m, ')');
  c->err = m.p;
}

uint32_t sc_ptr_push(cx_t *c, const char *seg, uint32_t n) {
  uint32_t at = c->ptr.n;
  if (!c->ptr.n) aici_buf_putc(&c->ptr, '#');
  aici_buf_putc(&c->ptr, '/');
  for (uint32_t i = 0; i < n; i++) {
    if (seg[i] == '~') aici_buf_puts(&c->ptr, "~0");
    else if (seg[i] == '/') aici_buf_puts(&c->ptr, "~1");
    else aici_buf_putc(&c->ptr, seg[i]);
  }
  return at;
}
uint32_t sc_ptr_pushs(cx_t *c, const char *seg) {
  uint32_t n = 0;
  while (seg[n]) n++;
  return sc_ptr_push(c, seg, n);
}
uint32_t sc_ptr_pushi(cx_t *c, uint32_t i) {
  char t[12];
  int k = 0;
  do t[k++] = (char)('0' + i % 10), i /= 10; while (i);
  char s[12];
  for (int j = 0; j < k; j++) s[j] = t[k - 1 - j];
  return sc_ptr_push(c, s, (uint32_t)k);
}
void sc_ptr_pop(cx_t *c, uint32_t at) {
  c->ptr.n = at;
  if (c->ptr.p) c->ptr.p[at] = 0;
}

bool sc_ignored(cx_t *c, const char *kw) {
  const char *s = c->o->ignore;
  uint32_t n = 0;
  while (kw[n]) n++;
  while (s && *s) {
    uint32_t k = 0;
    while (s[k] && s[k] != ',') k++;
    if (k == n && !__builtin_memcmp(s, kw, n)) return true;
    s += k + (s[k] == ',');
  }
  return false;
}

void sc_relax(cx_t *c, const char *kw) {
  aici_buf_t *l = &c->out->log;
  aici_buf_puts(l, "json: not enforcing ");
  aici_buf_puts(l, kw);
  aici_buf_puts(l, " at ");
  aici_buf_puts(l, c->ptr.n ? c->ptr.p : "#");
  aici_buf_puts(l, " (option ignore)\n");
}

/* Internal keyword of complements (negate): strings other than those listed (a JSON array).
 * Merged by union; written as a pattern, or checked directly against enum/const literals. No
 * schema spells it (it starts with a control character). */
#define NOT_IN_LEN 7u

/* ---- keywords -------------------------------------------------------------------------------- */
const char *const ANNOTATIONS[] = {
  "title", "description", "default", "examples", "example", "$schema", "$id", "id", "$comment",
  "readOnly", "writeOnly", "deprecated", "contentEncoding", "contentMediaType", "contentSchema",
  "$anchor", "$vocabulary", "definitions", "$defs", "$recursiveAnchor", "$dynamicAnchor", 0};
static const char *const HANDLED[] = {
  "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
  "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
  "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf", "oneOf",
  "allOf", "$ref", "minProperties", "maxProperties", "uniqueItems", "patternProperties", NOT_IN, 0};
static const char *const UNSUPPORTED_KWS[] = {
  "not", "if", "then", "else", "dependencies", "dependentRequired", "dependentSchemas", "contains",
  "minContains", "maxContains", "propertyNames", "unevaluatedProperties",
  "unevaluatedItems", "$dynamicRef", "$recursiveRef",
  "divisibleBy", "disallow", "extends", 0};   /* draft 3's: refused, not skipped */

bool sc_in_list(const jv_t *k, const char *const *l) {
  for (; *l; l++)
    if (jv_str_is(k, *l)) return true;
  return false;
}

bool sc_is_constraint_key(const jv_t *k) { return !sc_in_list(k, ANNOTATIONS) && (sc_in_list(k, HANDLED) || sc_in_list(k, UNSUPPORTED_KWS)); }

/* A keyword's value of the wrong kind (`maximum: "abc"`, `required: "a"`, `properties: []`):
 * what it should be, or NULL when it is well-formed. Draft 4's boolean exclusive bounds and
 * draft 3's boolean `required` are well-formed. */
static const char *malformed(const jv_t *k, const jv_t *v) {
  static const char *const NUMS[] = {"minimum", "maximum", 0};
  static const char *const COUNTS[] = {"minLength", "maxLength", "minItems", "maxItems", "minProperties",
                                       "maxProperties", 0};
  static const char *const SCHEMA_MAPS[] = {"properties", "patternProperties", "$defs", "definitions", 0};
  static const char *const SCHEMAS[] = {"additionalProperties", "additionalItems", "not", "if", "then", "else",
                                        "contains", "propertyNames", 0};
  static const char *const LISTS[] = {"allOf", "anyOf", "oneOf", 0};
  static const char *const STRINGS[] = {"pattern", "format", "$ref", 0};
  bool is_schema = v->kind == JV_OBJ || v->kind == JV_TRUE || v->kind == JV_FALSE;
  if (sc_in_list(k, NUMS)) return v->kind == JV_NUM ? 0 : "not a number";
  if (jv_str_is(k, "exclusiveMinimum") || jv_str_is(k, "exclusiveMaximum"))
    return v->kind == JV_NUM || v->kind == JV_TRUE || v->kind == JV_FALSE ? 0 : "not a number";
  if (jv_str_is(k, "multipleOf")) return v->kind == JV_NUM && v->num > 0 ? 0 : "not a number above 0";
  if (sc_in_list(k, COUNTS)) return v->kind == JV_NUM && jv_is_int(v) && v->num >= 0 ? 0 : "not a non-negative integer";
  if (sc_in_list(k, SCHEMA_MAPS)) {
    if (v->kind != JV_OBJ) return "not an object";
    for (uint32_t i = 0; i < v->n; i++) {
      const jv_t *x = &v->items[i];
      if (x->kind != JV_OBJ && x->kind != JV_TRUE && x->kind != JV_FALSE) return "a value that is no schema";
    }
    return 0;
  }
  if (sc_in_list(k, SCHEMAS)) return is_schema ? 0 : "not a schema (an object or a boolean)";
  if (sc_in_list(k, LISTS)) {
    if (v->kind != JV_ARR || !v->n) return "not a non-empty array";
    for (uint32_t i = 0; i < v->n; i++)
      if (v->items[i].kind != JV_OBJ && v->items[i].kind != JV_TRUE && v->items[i].kind != JV_FALSE) return "an item that is no schema";
    return 0;
  }
  if (sc_in_list(k, STRINGS)) return v->kind == JV_STR ? 0 : "not a string";
  if (jv_str_is(k, "required")) {
    if (v->kind == JV_TRUE || v->kind == JV_FALSE) return 0;
    if (v->kind != JV_ARR) return "not an array of strings";
    for (uint32_t i = 0; i < v->n; i++)
      if (v->items[i].kind != JV_STR) return "not an array of strings";
    return 0;
  }
  if (jv_str_is(k, "enum")) return v->kind == JV_ARR ? 0 : "not an array";
  if (jv_str_is(k, "type")) {
    if (v->kind == JV_STR) return 0;
    if (v->kind != JV_ARR) return "not a type name or an array of them";
    for (uint32_t i = 0; i < v->n; i++)
      if (v->items[i].kind != JV_STR) return "not a type name or an array of them";
    return 0;
  }
  if (jv_str_is(k, "items")) {
    if (is_schema) return 0;
    if (v->kind != JV_ARR) return "not a schema or an array of schemas";
    for (uint32_t i = 0; i < v->n; i++)
      if (v->items[i].kind != JV_OBJ && v->items[i].kind != JV_TRUE && v->items[i].kind != JV_FALSE) return "an item that is no schema";
    return 0;
  }
  if (jv_str_is(k, "prefixItems")) return v->kind == JV_ARR ? 0 : "not an array of schemas";
  if (jv_str_is(k, "uniqueItems")) return v->kind == JV_TRUE || v->kind == JV_FALSE ? 0 : "not a boolean";
  return 0;
}

/* Keyword values of the wrong kind (every keyword, ignored or not): an error naming the
 * keyword's pointer. */
bool sc_check_values(cx_t *c, const jv_t *s) {
  for (uint32_t i = 0; s && s->kind == JV_OBJ && i < s->n; i++) {
    const char *bad = malformed(&s->keys[i], &s->items[i]);
    if (!bad) continue;
    uint32_t at = sc_ptr_push(c, s->keys[i].s, s->keys[i].n);
    sc_fail(c, "bad schema: ", "value", bad);
    sc_ptr_pop(c, at);
    return false;
  }
  return true;
}

/* Errors for keywords the compiler cannot enforce (unless ignored on request), and for
 * keyword values of the wrong kind. */
bool sc_check_keywords(cx_t *c, const jv_t *s) {
  if (!sc_check_values(c, s)) return false;
  for (uint32_t i = 0; i < s->n; i++) {
    const jv_t *k = &s->keys[i], *v = &s->items[i];
    const char *kw = 0;
    for (const char *const *l = UNSUPPORTED_KWS; *l && !kw; l++)
      if (jv_str_is(k, *l)) kw = *l;
    if (jv_str_is(k, "uniqueItems") && v->kind == JV_TRUE) kw = "uniqueItems";
    if (jv_str_is(k, "required") && v->kind == JV_TRUE) kw = "required";   /* draft 3's boolean form */
    if (!kw) continue;
    if (sc_ignored(c, kw)) { sc_relax(c, kw); continue; }
    UNSUPPORTED(c, kw, 0);
    return false;
  }
  return true;
}

/* ---- $ref ------------------------------------------------------------------------------------ */
static bool seg_eq(const jv_t *k, const char *s, uint32_t n) {
  aici_buf_t d = {0};                        /* the segment with ~1 ~0 and %25-style escapes undone */
  for (uint32_t i = 0; i < n; i++) {
    if (s[i] == '~' && i + 1 < n) { aici_buf_putc(&d, s[i + 1] == '1' ? '/' : '~'); i++; }
    else if (s[i] == '%' && i + 2 < n) {
      int h = s[i + 1], l = s[i + 2];
      h = h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10, l = l <= '9' ? l - '0' : (l | 0x20) - 'a' + 10;
      aici_buf_putc(&d, (char)(h * 16 + l));
      i += 2;
    } else aici_buf_putc(&d, s[i]);
  }
  bool eq = k->n == d.n && (!d.n || !__builtin_memcmp(k->s, d.p, d.n));
  aici_free(d.p);
  return eq;
}

/* The sub-schema named by a plain-name fragment: `$anchor: NAME`, or (drafts 4-7) `id` / `$id`
 * `#NAME`; values that are data (enum, const, default, examples) are not searched. */
static const jv_t *find_anchor(const jv_t *v, const char *name, uint32_t n, uint32_t depth) {
  if (depth > 64 || (v->kind != JV_OBJ && v->kind != JV_ARR)) return 0;
  if (v->kind == JV_OBJ) {
    const jv_t *a = jv_get(v, "$anchor");
    if (a && a->kind == JV_STR && a->n == n && !__builtin_memcmp(a->s, name, n)) return v;
    for (const char *const *k = (const char *const[]){"id", "$id", 0}; *k; k++) {
      a = jv_get(v, *k);
      if (a && a->kind == JV_STR && a->n == n + 1 && a->s[0] == '#' && !__builtin_memcmp(a->s + 1, name, n)) return v;
    }
  }
  static const char *const DATA[] = {"enum", "const", "default", "examples", 0};
  for (uint32_t i = 0; i < v->n; i++) {
    if (v->kind == JV_OBJ && sc_in_list(&v->keys[i], DATA)) continue;
    const jv_t *f = find_anchor(&v->items[i], name, n, depth + 1);
    if (f) return f;
  }
  return 0;
}

const jv_t *sc_resolve(cx_t *c, const jv_t *ref) {
  if (ref->kind != JV_STR || !ref->n || ref->s[0] != '#') {
    UNSUPPORTED(c, "$ref", "only local references (#...) are supported");
    return 0;
  }
  const jv_t *v = c->root;
  const char *s = ref->s + 1, *end = ref->s + ref->n;
  while (s < end) {
    if (*s != '/') {                   /* a plain name: an anchor */
      const jv_t *a = v == c->root ? find_anchor(c->root, s, (uint32_t)(end - s), 0) : 0;
      if (!a) sc_fail(c, "bad schema: ", "$ref", "no such anchor");
      return a;
    }
    const char *seg = ++s;
    while (s < end && *s != '/') s++;
    uint32_t n = (uint32_t)(s - seg);
    const jv_t *next = 0;
    if (v->kind == JV_OBJ) {
      for (uint32_t i = 0; i < v->n; i++)
        if (seg_eq(&v->keys[i], seg, n)) next = &v->items[i];
    } else if (v->kind == JV_ARR) {
      uint32_t idx = 0;
      for (uint32_t i = 0; i < n; i++) idx = idx * 10 + (uint32_t)(seg[i] - '0');
      if (idx < v->n) next = &v->items[idx];
    }
    if (!next) { sc_fail(c, "bad schema: ", "$ref", "no such location"); return 0; }
    v = next;
  }
  return v;
}

/* ---- machines -------------------------------------------------------------------------------- */
uint64_t key_arg;

int32_t sc_machine_find(cx_t *c, const jv_t *schema, uint32_t kind) {
  for (uint32_t i = 0; i < c->n_keys; i++)
    if (c->keys[i].key == schema && c->keys[i].kind == kind && c->keys[i].arg == key_arg) return (int32_t)i;
  return -1;
}

/* The machine for (schema, kind), created pending; `ptr` names it in errors (NULL: here). */
uint32_t sc_machine_for(cx_t *c, const jv_t *schema, uint32_t kind, const char *ptr, uint32_t ptr_len) {
  int32_t found = sc_machine_find(c, schema, kind);
  if (found >= 0) return (uint32_t)found;
  if (c->n_keys == MAX_MACHINES) { UNSUPPORTED(c, "schema", "over 4096 machines"); return 0; }
  uint32_t i = c->n_keys++;
  if ((i & (i - 1)) == 0) {
    uint32_t cap = i ? 2 * i : 1;
    c->keys = aici_realloc(c->keys, cap * sizeof(mkey_t));
    c->pending = aici_realloc(c->pending, cap * sizeof(void *));
    c->ptrs = aici_realloc(c->ptrs, cap * sizeof(char *));
    c->texts = aici_realloc(c->texts, cap * sizeof(machine_src_t));
  }
  c->keys[i].key = schema, c->keys[i].kind = kind, c->keys[i].arg = key_arg;
  c->pending[i] = schema;
  c->texts[i] = (machine_src_t){0};
  aici_buf_t p = {0};
  if (ptr) aici_buf_putn(&p, ptr, ptr_len);
  else aici_buf_puts(&p, c->ptr.n ? c->ptr.p : "#");
  c->ptrs[i] = p.p;
  return i;
}

void sc_set_text(cx_t *c, uint32_t m, const char *text, uint32_t n) {
  char *t = aici_malloc(n + 1);
  __builtin_memcpy(t, text, n);
  t[n] = 0;
  c->texts[m].text = t, c->texts[m].len = n;
  c->pending[m] = 0;
}

void sc_emit_call(cx_t *c, aici_buf_t *b, uint32_t m) {
  aici_buf_puts(b, "(?:");
  sb_byte(b, CALL_BYTE), sb_byte(b, (uint8_t)(m >> 8)), sb_byte(b, (uint8_t)m);
  aici_buf_putc(b, ')');
}

void sc_emit_value(cx_t *c, aici_buf_t *b, const jv_t *s) { sc_emit_value_within(c, b, s, OUTLINE_BYTES); }

/* A sub-schema inline, or as a call when its text is over `inline_max` bytes (cut out into its
 * own machine). */
void sc_emit_value_within(cx_t *c, aici_buf_t *b, const jv_t *s, uint32_t inline_max) {
  int32_t known = sc_machine_find(c, s, 3);
  if (known >= 0) { sc_emit_call(c, b, (uint32_t)known); return; }
  uint32_t at = b->n;
  sc_emit(c, b, s);
  if (c->err || b->n - at <= inline_max) return;
  for (uint32_t i = 0; i < c->n_keys; i++)   /* the same text from another schema node: one machine */
    if (c->texts[i].text && !c->texts[i].counted && c->texts[i].len == b->n - at &&
        !__builtin_memcmp(c->texts[i].text, b->p + at, b->n - at)) {
      b->n = at, b->p[at] = 0;
      sc_emit_call(c, b, i);
      return;
    }
  uint32_t m = sc_machine_for(c, s, 3, 0, 0);
  if (c->err) return;
  sc_set_text(c, m, b->p + at, b->n - at);
  b->n = at, b->p[at] = 0;
  sc_emit_call(c, b, m);
}

/* ---- the dispatcher -------------------------------------------------------------------------- */
static void emit_alts(cx_t *c, aici_buf_t *b, const jv_t *s, const char *kw) {
  const jv_t *alts = jv_get(s, kw);
  if (!alts || alts->kind != JV_ARR || !alts->n) { sc_fail(c, "bad schema: ", kw, "not a non-empty array"); return; }
  const char *const drop[] = {kw, 0};  /* oneOf first: a sibling anyOf is distributed in */
  const jv_t *rest = sc_obj_without(s, drop);
  bool siblings = false;
  for (uint32_t i = 0; i < rest->n; i++) siblings |= sc_is_constraint_key(&rest->keys[i]);
  uint32_t excluded = 0;
  if (kw[0] == 'o' && !sc_one_of_exact(c, alts, rest, &excluded) && !c->err) {
    excluded = 0;
    if (sc_emit_one_of_by_complements(c, b, alts, rest, siblings)) return;
    if (c->o->coerce_one_of) sc_relax(c, "oneOf (as anyOf: option coerce_one_of)");
    else { UNSUPPORTED(c, "oneOf", "branches that may overlap; the option coerce_one_of compiles it as anyOf"); return; }
  }
  if (c->err) return;
  jv_t *only = 0;                      /* the kinds no value of which matches exactly one branch, out */
  if (excluded) {
    only = jv_new(JV_OBJ);
    jv_obj_put(only, "type", 4, sc_types_value(127 & ~excluded));
  }
  aici_buf_puts(b, "(?:");
  bool first = true;
  for (uint32_t i = 0; i < alts->n && !c->err; i++) {
    uint32_t at = sc_ptr_pushs(c, kw);
    sc_ptr_pushi(c, i);
    const jv_t *alt = siblings ? sc_all_of2(rest, &alts->items[i]) : &alts->items[i];
    if (only) alt = sc_all_of2(alt, only);
    if (!sc_obviously_empty(c, alt, 0)) {
      if (!first) aici_buf_putc(b, '|');
      first = false;
      sc_emit(c, b, alt);
    }
    sc_ptr_pop(c, at);
  }
  if (first) aici_buf_puts(b, "[^\\x00-\\xff]");
  aici_buf_putc(b, ')');
}

/* Literals beside a string schema's own keywords only (type, pattern, format, minLength,
 * maxLength): each decided exactly, a string by the pattern's and the format's regexes on its
 * canonical content and its length in code points (an astral character, a surrogate pair in
 * the schema's text, is one), any other value by `type` alone. False: `rest` is no such schema,
 * or a keyword there cannot be compiled (the caller then checks on one regex). */
static bool literals_by_string_keywords(cx_t *c, const jv_t *rest, const jv_t *v, uint32_t n, bool *keep) {
  static const char *const OWN[] = {"type", "pattern", "format", "minLength", "maxLength", 0};
  for (uint32_t i = 0; i < rest->n; i++)
    if (sc_is_constraint_key(&rest->keys[i]) && !sc_in_list(&rest->keys[i], OWN)) return false;
  const jv_t *t = jv_get(rest, "type"), *pat = jv_get(rest, "pattern"), *fmt = jv_get(rest, "format");
  const jv_t *mn = jv_get(rest, "minLength"), *mx = jv_get(rest, "maxLength");
  if ((pat && pat->kind != JV_STR) || (fmt && fmt->kind != JV_STR) || (mn && mn->kind != JV_NUM) || (mx && mx->kind != JV_NUM))
    return false;
  if (fmt && sc_ignored(c, "format")) sc_relax(c, "format"), fmt = 0;
  uint32_t bits = t ? sc_type_bits(t) : 127;
  aici_regex_t *re[2] = {0, 0};
  for (uint32_t k = 0; k < 2; k++) {
    const jv_t *src = k ? fmt : pat;
    if (!src) continue;
    aici_buf_t r = {0};
    const char *why = 0;
    bool ok = k ? sc_emit_format(&r, src->s) : emit_pattern(&r, src->s, src->n, &why);
    re[k] = ok ? aici_regex_compile(r.p, r.n, 0) : 0;
    aici_free(r.p);
    if (!re[k]) return false;
  }
  for (uint32_t i = 0; i < n; i++) {
    const jv_t *x = &v[i];
    uint32_t kind = x->kind == JV_NULL ? 1 : x->kind <= JV_TRUE ? 2 : x->kind == JV_OBJ ? 4 : x->kind == JV_ARR ? 8
                  : x->kind == JV_STR ? 16 : jv_is_int(x) ? 32 : 64;
    keep[i] = (bits & kind) != 0;
    if (!keep[i] || x->kind != JV_STR) continue;
    aici_buf_t w = {0};                      /* the canonical content: the text without its quotes */
    jv_write_str(&w, x->s, x->n);
    for (uint32_t k = 0; k < 2 && keep[i]; k++) {
      if (!re[k]) continue;
      uint32_t st = aici_regex_advance(re[k], aici_regex_start(re[k]), (const uint8_t *)w.p + 1, w.n - 2);
      keep[i] = st && aici_regex_accepting(re[k], st);
    }
    aici_free(w.p);
    uint64_t chars = 0;
    for (uint32_t b = 0; b < x->n; b++) chars += ((uint8_t)x->s[b] & 0xc0) != 0x80;
    if (mn && (double)chars < mn->num) keep[i] = false;
    if (mx && (double)chars > mx->num) keep[i] = false;
  }
  return true;
}

/* enum / const: the literals that the rest of the schema allows. */
static void emit_literals(cx_t *c, aici_buf_t *b, const jv_t *s) {
  const jv_t *k = jv_get(s, "const"), *e = jv_get(s, "enum");
  if (e && e->kind != JV_ARR) { sc_fail(c, "bad schema: ", "enum", "not an array"); return; }
  static const char *const drop[] = {"enum", "const", NOT_IN, 0};
  const jv_t *rest = sc_obj_without(s, drop), *not_in = jv_get(s, NOT_IN);
  bool constrained = false;
  for (uint32_t i = 0; i < rest->n; i++) constrained |= sc_is_constraint_key(&rest->keys[i]);
  aici_regex_t *re = 0;
  uint32_t n_lit = k ? 1 : e->n;
  bool *keep_exact = aici_malloc(n_lit + 1);
  bool exact = constrained && literals_by_string_keywords(c, rest, k ? k : e->items, n_lit, keep_exact);
  if (constrained && !exact) {         /* keep the literals that the rest's language holds */
    aici_buf_t r = {0};
    uint32_t nm = c->n_keys;
    uint64_t longest = 0, saved = c->flat_cap;
    for (uint32_t i = 0; i < (k ? 1 : e->n); i++) {
      const jv_t *v = k ? k : &e->items[i];
      aici_buf_t t = {0};                    /* its text's bytes bound every string in it, in characters */
      jv_write(&t, v);
      if (t.n > longest) longest = t.n;
      aici_free(t.p);
    }
    c->flat_cap = longest + 1;         /* no string machine: a literal's text is checked by one regex */
    sc_emit(c, &r, rest);
    c->flat_cap = saved;
    if (c->err) return;
    bool calls = c->n_keys != nm;
    for (uint32_t i = 0; i < r.n && !calls; i++) calls = i + 3 < r.n && !__builtin_memcmp(r.p + i, "\\xff", 4);
    /* a call stands for a structured value: scalar literals never take one, structured ones
     * cannot be checked against it */
    for (uint32_t i = 0; calls && i < (k ? 1 : e->n); i++) {
      const jv_t *v = k ? k : &e->items[i];
      if (v->kind == JV_ARR || v->kind == JV_OBJ) {
        UNSUPPORTED(c, k ? "const" : "enum", "structured values with constraints beside them");
        aici_free(r.p), aici_free(keep_exact);
        return;
      }
    }
    re = aici_regex_compile(r.p, r.n, 0);
    aici_free(r.p);
  }
  aici_buf_puts(b, "(?:");
  bool any = false;
  uint32_t n = k ? 1 : e->n;
  for (uint32_t i = 0; i < n; i++) {
    const jv_t *v = k ? k : &e->items[i];
    aici_buf_t t = {0};
    jv_write(&t, v);
    bool keep = !exact || keep_exact[i];
    if (k && e) {                      /* const beside enum: the const only if the enum lists it */
      bool listed = false;
      for (uint32_t j = 0; j < e->n && !listed; j++) listed = jv_equal(k, &e->items[j]);
      keep = keep && listed;
    }
    for (uint32_t w = 0; not_in && not_in->kind == JV_ARR && w < not_in->n && keep; w++) keep = !jv_equal(v, &not_in->items[w]);
    if (re && keep) {
      uint32_t st = aici_regex_advance(re, aici_regex_start(re), (const uint8_t *)t.p, t.n);
      keep = st && aici_regex_accepting(re, st);
    }
    if (keep) {
      if (any) aici_buf_putc(b, '|');
      sb_lit(b, t.p, t.n);
      any = true;
    }
    aici_free(t.p);
  }
  if (!any) aici_buf_puts(b, "[^\\x00-\\xff]");
  aici_buf_putc(b, ')');
  aici_free(keep_exact);
}

static void emit_schema(cx_t *c, aici_buf_t *b, const jv_t *s);

void sc_emit(cx_t *c, aici_buf_t *b, const jv_t *s) {
  if (c->err) return;
  if (++c->depth > 48) {
    UNSUPPORTED(c, "schema", "nested over 48 levels inline, as a recursion through allOf is");
  } else {
    emit_schema(c, b, s);
  }
  c->depth--;
}

static void emit_schema(cx_t *c, aici_buf_t *b, const jv_t *s) {
  if (s == &ANY_MARK || s->kind == JV_TRUE) { sc_emit_any_value(c, b); return; }
  if (s->kind == JV_FALSE) { aici_buf_puts(b, "[^\\x00-\\xff]"); return; }
  if (s->kind != JV_OBJ) { sc_fail(c, "bad schema: ", "schema", "expected an object or a boolean"); return; }
  if (!sc_check_values(c, s)) return;
  if (jv_get(s, "not")) {              /* written as its operand's complement */
    const jv_t *r = sc_without_not(c, s);
    if (!r || c->err) return;
    if (r != s) { sc_emit(c, b, r); return; }
  }
  if (!sc_check_keywords(c, s)) return;
  const jv_t *r = jv_get(s, "$ref");
  if (r && !jv_get(s, "allOf")) {
    bool siblings = false;
    for (uint32_t i = 0; i < s->n; i++) siblings |= !jv_str_is(&s->keys[i], "$ref") && sc_is_constraint_key(&s->keys[i]);
    if (!siblings) {                   /* a call: one machine per target, recursion included */
      const jv_t *t = sc_resolve(c, r);
      if (!t) return;
      uint32_t m = sc_machine_for(c, t, 2, r->s, r->n);   /* compiled later, named by the ref */
      if (c->err) return;
      sc_emit_call(c, b, m);
      return;
    }
  }
  if (jv_get(s, "allOf") || r) {
    const jv_t *m = sc_flatten(c, s);
    if (!m || c->err) return;
    sc_emit(c, b, m);
    return;
  }
  if (jv_get(s, "oneOf")) { emit_alts(c, b, s, "oneOf"); return; }
  if (jv_get(s, "anyOf")) { emit_alts(c, b, s, "anyOf"); return; }
  if (jv_get(s, "enum") || jv_get(s, "const")) { emit_literals(c, b, s); return; }
  const jv_t *t = jv_get(s, "type");
  uint32_t bits = t ? sc_type_bits(t) : 127;
  if (t && !bits) {
    if (t->kind == JV_ARR && t->n == 0) { aici_buf_puts(b, "[^\\x00-\\xff]"); return; }
    sc_fail(c, "bad schema: ", "type", "unknown type name");
    return;
  }
  aici_buf_puts(b, "(?:");
  bool first = true;
#define ALT() (aici_buf_puts(b, first ? "" : "|"), first = false)
  if (bits & 1) ALT(), aici_buf_puts(b, "null");
  if (bits & 2) ALT(), aici_buf_puts(b, "true|false");
  if (bits & 4) ALT(), sc_emit_object(c, b, s);
  if (bits & 8) ALT(), sc_emit_array(c, b, s);
  if (bits & 16) ALT(), sc_emit_string(c, b, sc_strings_of(c, s));
  if (bits & 64) ALT(), sc_emit_num(c, b, s, false);
  else if (bits & 32) ALT(), sc_emit_num(c, b, s, true);
#undef ALT
  aici_buf_putc(b, ')');
}

/* The length of a machine's regex text with each \\M (one multi-byte character, emit_cp_set)
 * written out as the byte-range split it stands for: what TEXT_MAX bounds (the DFAs grow with the
 * language's written size, not with the shorthand). */
static uint64_t written_out_len(const char *t, uint32_t n) {
  static uint32_t m_len;
  if (!m_len) {
    cp_set_t s = {0};
    aici_buf_t b = {0};
    aici_cps_add(&s, 0x80, 0x10ffff);
    aici_cps_regex(&b, &s);
    m_len = b.n;
    aici_free(b.p), aici_free(s.r);
  }
  uint64_t len = n;
  for (uint32_t i = 0; t && i < n; i++)
    if (t[i] == '\\' && i + 1 < n) len += t[++i] == 'M' ? m_len - 2 : 0;
  return len;
}

bool schema_compile(const jv_t *schema, const json_opts_t *o, compiled_t *out, char **err) {
  cx_t c = {.root = schema, .o = o, .out = out};
  if (o->whitespace) {
    aici_buf_t w = {0};
    aici_buf_puts(&w, "[\\x20\\x0a\\x0d\\x09]{0,");
    sb_uint(&w, o->whitespace > 64 ? 64 : o->whitespace);
    aici_buf_putc(&w, '}');
    __builtin_memcpy(c.ws, w.p, w.n + 1);
    aici_free(w.p);
  }
  sc_machine_for(&c, schema, 0, "#", 1);
  for (uint32_t i = 0; i < c.n_keys && !c.err; i++) {
    if (!c.pending[i]) continue;       /* written already (free-form values, outlined schemas) */
    const jv_t *s = c.pending[i];
    aici_free(c.ptr.p);
    c.ptr = (aici_buf_t){0};
    if (c.ptrs[i][0] && c.ptrs[i][1]) aici_buf_puts(&c.ptr, c.ptrs[i]);   /* "#" alone: the root */
    aici_buf_t text = {0};
    sc_emit(&c, &text, s);
    sc_set_text(&c, i, text.p ? text.p : "", text.n);
    aici_free(text.p);
  }
  uint64_t total = 0;                  /* a checked limit on the regex text: its DFAs grow with it */
  for (uint32_t i = 0; i < c.n_keys; i++) total += written_out_len(c.texts[i].text, c.texts[i].len);
  if (!c.err && total > TEXT_MAX) {
    aici_buf_t m = {0};
    aici_buf_puts(&m, "too large: schema at # (its ");
    sb_uint(&m, c.n_keys);
    aici_buf_puts(&m, " machines' regexes take ");
    sb_uint(&m, total);
    aici_buf_puts(&m, " bytes; at most 2 MiB: split it, or use fewer properties or literals)");
    c.err = m.p;
  }
  for (uint32_t i = 0; i < c.n_keys; i++) aici_free(c.ptrs[i]);
  out->m = c.texts, out->n = c.n_keys;
  aici_free(c.keys), aici_free(c.pending), aici_free(c.ptrs), aici_free(c.ptr.p);
  if (c.err) { *err = c.err; return false; }
  return true;
}
