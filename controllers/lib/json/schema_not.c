/* Complements: `not`, and oneOf made exact by its branches' complements: part of the schema
 * compiler (schema_int.h). */
#include "schema_int.h"

/* ---- complements: `not`, and oneOf made exact ------------------------------------------------
 * sc_negate(s) is the complement of s as a list of schemas whose union it is (an empty list: s
 * admits every value), written with keywords this compiler enforces exactly; NULL (no error set)
 * when it has no such form: a keyword whose complement is not written here (pattern, format,
 * multipleOf, items, additionalProperties other than true, minProperties, ...), structured
 * enum/const values, "integers" without enum (no type names the numbers that are no integers). */
#define NEG_MAX 64u                    /* disjuncts in one complement at most */
#define NEG_WORD_BYTES 256u            /* a string literal whose complement is written: its bytes at most */
#define ONE_OF_TERMS 256u              /* alternatives of an exact oneOf at most */
#define ONE_OF_BYTES (1024u << 10)     /* and their regex text with the machines they make
                                          (16-24x that in guest memory, measured) */

static jv_t *jstr(const char *s, uint32_t n) {
  jv_t *v = jv_new(JV_STR);
  v->s = s, v->n = n;
  return v;
}

static jv_t *jnum(uint64_t x) {
  aici_buf_t t = {0};
  sb_uint(&t, x);
  jv_t *v = jv_new(JV_NUM);
  v->s = t.p, v->n = t.n, v->num = (double)x;
  return v;
}

static jv_t *typed(uint32_t bits) {    /* {"type": bits} */
  jv_t *o = jv_new(JV_OBJ);
  jv_obj_put(o, "type", 4, sc_types_value(bits));
  return o;
}

static jv_t *typed_kw(uint32_t bits, const char *kw, const jv_t *v) {
  jv_t *o = typed(bits);
  uint32_t n = 0;
  while (kw[n]) n++;
  jv_obj_put(o, kw, n, v);
  return o;
}

static void jv_push(jv_t *arr, const jv_t *v) {
  arr->items = aici_realloc(arr->items, (arr->n + 1) * sizeof(jv_t));
  arr->items[arr->n++] = *v;
}

static bool neg_push(jv_t *out, const jv_t *v) {
  if (out->n >= NEG_MAX) return false;
  jv_push(out, v);
  return true;
}

static void cp_escape(aici_buf_t *b, uint32_t cp) {   /* an ECMA escape of one code point */
  static const char hx[] = "0123456789abcdef";
  if (cp > 0xffff) {
    aici_buf_puts(b, "\\u{");
    char t[8];
    int k = 0;
    do t[k++] = hx[cp & 15], cp >>= 4; while (cp);
    while (k) aici_buf_putc(b, t[--k]);
    aici_buf_putc(b, '}');
    return;
  }
  char e[6] = {'\\', 'u', hx[cp >> 12], hx[(cp >> 8) & 15], hx[(cp >> 4) & 15], hx[cp & 15]};
  aici_buf_putn(b, e, 6);
}

typedef struct { uint32_t *cp, n; } cps_t;  /* a string's code points */

static cps_t decode(const jv_t *s) {
  cps_t r = {aici_malloc((s->n + 1) * 4), 0};
  const uint8_t *p = (const uint8_t *)s->s;
  for (uint32_t i = 0; i < s->n;) {
    uint32_t c = p[i], len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    uint32_t v = len == 1 ? c : len == 2 ? c & 31 : len == 3 ? c & 15 : c & 7;
    for (uint32_t k = 1; k < len && i + k < s->n; k++) v = v << 6 | (p[i + k] & 63);
    r.cp[r.n++] = v, i += len;
  }
  return r;
}

/* Strings other than w[0..n) (each sharing the first `d` code points): an ECMA pattern body
 * from the trie of the words. */
static void words_complement(aici_buf_t *b, cps_t *w, uint32_t n, uint32_t d) {
  bool terminal = false;
  uint32_t *kids = aici_malloc((n + 1) * 4), nk = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (w[i].n == d) { terminal = true; continue; }
    bool seen = false;
    for (uint32_t k = 0; k < nk && !seen; k++) seen = kids[k] == w[i].cp[d];
    if (!seen) kids[nk++] = w[i].cp[d];
  }
  aici_buf_puts(b, "(?:");
  if (!nk) aici_buf_puts(b, "[^]+");
  else {
    aici_buf_puts(b, "[^");
    for (uint32_t k = 0; k < nk; k++) cp_escape(b, kids[k]);
    aici_buf_puts(b, "][^]*");
  }
  cps_t *sub = aici_malloc((n + 1) * sizeof(cps_t));
  for (uint32_t k = 0; k < nk; k++) {
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
      if (w[i].n > d && w[i].cp[d] == kids[k]) sub[m++] = w[i];
    aici_buf_putc(b, '|');
    cp_escape(b, kids[k]);
    words_complement(b, sub, m, d + 1);
  }
  aici_buf_putc(b, ')');
  if (!terminal) aici_buf_putc(b, '?');      /* this prefix itself is no word */
  aici_free(sub), aici_free(kids);
}


/* A string schema with its NOT_IN written as a pattern (the trie of the words, complemented). */
const jv_t *sc_strings_of(cx_t *c, const jv_t *s) {
  const jv_t *w = jv_get(s, NOT_IN);
  if (!w || w->kind != JV_ARR) return s;
  if (jv_get(s, "pattern") || jv_get(s, "format")) {
    UNSUPPORTED(c, "not", "strings other than listed ones beside a pattern or format: the complement of a not or oneOf branch");
    return s;
  }
  cps_t *words = aici_malloc((w->n + 1) * sizeof(cps_t));
  uint32_t n = 0;
  for (uint32_t i = 0; i < w->n; i++)
    if (w->items[i].kind == JV_STR) words[n++] = decode(&w->items[i]);
  aici_buf_t p = {0};
  aici_buf_putc(&p, '^');
  words_complement(&p, words, n, 0);
  aici_buf_putc(&p, '$');
  for (uint32_t i = 0; i < n; i++) aici_free(words[i].cp);
  aici_free(words);
  static const char *const drop[] = {NOT_IN, 0};
  jv_t *o = sc_obj_without(s, drop);
  jv_obj_put(o, "pattern", 7, jstr(p.p, p.n));
  return o;
}

/* The complement, within types `T`, of enum/const values `v[0..n)` (scalars); false: not
 * expressible. Numbers: the open intervals between the listed ones (of type number: where T
 * has integers only, the numbers that are no integers belong to the complement too). */
static bool neg_literals(jv_t *out, uint32_t *whole, uint32_t T, const jv_t *v, uint32_t n) {
  bool has_null = false, has_t = false, has_f = false;
  uint32_t ns = 0, nn = 0;
  const jv_t **nums = aici_malloc((n + 1) * sizeof(void *));
  jv_t *words = jv_new(JV_ARR);
  bool ok = true;
  for (uint32_t i = 0; i < n && ok; i++) {
    switch (v[i].kind) {
      case JV_NULL: has_null = true; break;
      case JV_TRUE: has_t = true; break;
      case JV_FALSE: has_f = true; break;
      case JV_STR:                     /* (the trie's text nests a group a character: kept short) */
        if (v[i].n > NEG_WORD_BYTES) { ok = false; break; }
        ns++, jv_push(words, &v[i]);
        break;
      case JV_NUM:
        if (!(T & 64) && !jv_is_int(&v[i])) break;   /* no integer: not in T */
        if (!number_bound_ok(v[i].s, v[i].n, &(const char *){0})) { ok = false; break; }
        nums[nn++] = &v[i];
        break;
      default: ok = false;             /* structured values */
    }
  }
  if ((T & 1) && !has_null) *whole |= 1;
  if ((T & 2) && !has_t && !has_f) *whole |= 2;
  if (ok && (T & 2) && has_t != has_f) {   /* the other boolean */
    jv_t *o = jv_new(JV_OBJ);
    jv_obj_put(o, "const", 5, jv_new(has_t ? JV_FALSE : JV_TRUE));
    ok = neg_push(out, o);
  }
  *whole |= T & 12;
  if (ok && (T & 16)) {
    if (!ns) *whole |= 16;
    else ok = neg_push(out, typed_kw(16, NOT_IN, words));
  }
  if (ok && (T & 96)) {
    if (!nn) *whole |= T & 64 ? 64 : 32;
    else {
      for (uint32_t i = 1; i < nn; i++)  /* sorted by value (exact ties are equal values) */
        for (uint32_t k = i; k > 0 && nums[k]->num < nums[k - 1]->num; k--) {
          const jv_t *t = nums[k];
          nums[k] = nums[k - 1], nums[k - 1] = t;
        }
      ok = neg_push(out, typed_kw(64, "exclusiveMaximum", nums[0]));
      for (uint32_t i = 0; ok && i + 1 < nn; i++) {
        if (nums[i + 1]->num == nums[i]->num) continue;
        jv_t *o = typed_kw(64, "exclusiveMinimum", nums[i]);
        jv_obj_put(o, "exclusiveMaximum", 16, nums[i + 1]);
        ok = neg_push(out, o);
      }
      if (ok) ok = neg_push(out, typed_kw(64, "exclusiveMinimum", nums[nn - 1]));
    }
  }
  aici_free(nums);
  return ok;
}

static bool nonneg_int(const jv_t *v, uint64_t *x) {
  if (!v || v->kind != JV_NUM || !jv_is_int(v) || v->num < 0 || v->num > 9.0e15) return false;
  *x = (uint64_t)v->num;
  return true;
}

jv_t *sc_negate(cx_t *c, const jv_t *s, uint32_t depth, uint32_t U) {
  static const char *const STR_KW[] = {"pattern", "format", NOT_IN, 0};
  static const char *const NUM_KW[] = {"multipleOf", 0};
  static const char *const ARR_KW[] = {"items", "prefixItems", "additionalItems", "contains", "minContains",
                                       "maxContains", "unevaluatedItems", 0};
  static const char *const OBJ_KW[] = {"patternProperties", "minProperties", "maxProperties", "dependencies",
                                       "dependentRequired", "dependentSchemas", "propertyNames",
                                       "unevaluatedProperties", 0};
  if (depth > 8 || c->err) return 0;
  s = sc_flatten(c, s);
  if (!s || c->err) return 0;
  jv_t *out = jv_new(JV_ARR);
  if (s->kind == JV_TRUE) return out;
  if (s->kind == JV_FALSE) { neg_push(out, &ANY_MARK); return out; }
  if (s->kind != JV_OBJ) return 0;
  const jv_t *t = jv_get(s, "type"), *k = jv_get(s, "const"), *e = jv_get(s, "enum");
  uint32_t T = t ? sc_type_bits(t) : 127;
  if (t && !T) return 0;
  bool literals = k || (e && e->kind == JV_ARR);
  if ((T & 32) && !(T & 64) && (U & 64) && !literals) return 0;   /* "numbers that are no integers" */
  uint32_t whole = U & ~T & ~(T & 32 ? 96u : 0u);     /* kinds all of whose values are in it */
  T &= U;
  uint64_t x;
  for (uint32_t i = 0; i < s->n; i++) {
    const jv_t *key = &s->keys[i], *v = &s->items[i];
    if (!sc_is_constraint_key(key) || jv_str_is(key, "type") || jv_str_is(key, "const") || jv_str_is(key, "enum")) continue;
    bool ok = true;
    if (jv_str_is(key, "not")) {
      ok = neg_push(out, T == 127 ? v : sc_all_of2(typed(T), v));
    } else if (jv_str_is(key, "required")) {
      for (uint32_t r = 0; ok && (T & 4) && v->kind == JV_ARR && r < v->n; r++) {
        if (v->items[r].kind != JV_STR) continue;
        jv_t *p = jv_new(JV_OBJ);
        jv_obj_put(p, v->items[r].s, v->items[r].n, &FALSE_SCHEMA);
        ok = neg_push(out, typed_kw(4, "properties", p));
      }
    } else if (jv_str_is(key, "properties")) {
      for (uint32_t r = 0; ok && (T & 4) && v->kind == JV_OBJ && r < v->n; r++) {
        const jv_t *nd = sc_negate(c, &v->items[r], depth + 1, 127);
        if (!nd) return 0;
        if (!nd->n) continue;          /* the value may be anything */
        jv_t *req = jv_new(JV_ARR), *p = jv_new(JV_OBJ), *any = jv_new(JV_OBJ);
        jv_push(req, &v->keys[r]);     /* one disjunct: present, with a value in the union */
        jv_obj_put(any, "anyOf", 5, nd);
        jv_obj_put(p, v->keys[r].s, v->keys[r].n, nd->n == 1 ? nd->items : any);
        jv_t *o = typed_kw(4, "required", req);
        jv_obj_put(o, "properties", 10, p);
        ok = neg_push(out, o);
      }
    } else if (jv_str_is(key, "additionalProperties")) {
      if (T & 4) {
        const jv_t *nd = sc_negate(c, v, depth + 1, 127);
        ok = nd && nd->n == 0;           /* true or {}: no constraint */
      }
    } else if (jv_str_is(key, "minLength") || jv_str_is(key, "maxLength") || jv_str_is(key, "minItems") ||
               jv_str_is(key, "maxItems")) {
      bool str = key->s[3] == 'L', min = key->s[1] == 'i';
      if (!(T & (str ? 16 : 8))) continue;
      if (!nonneg_int(v, &x)) return 0;
      if (min && !x) continue;         /* minLength 0: every value */
      ok = neg_push(out, typed_kw(str ? 16 : 8, str ? (min ? "maxLength" : "minLength") : (min ? "maxItems" : "minItems"),
                                  jnum(min ? x - 1 : x + 1)));
    } else if (jv_str_is(key, "minimum") || jv_str_is(key, "maximum") || jv_str_is(key, "exclusiveMinimum") ||
               jv_str_is(key, "exclusiveMaximum")) {
      if (!(T & 96)) continue;
      if (v->kind != JV_NUM) return 0;   /* draft 4's boolean form */
      static const char *const flip[][2] = {{"minimum", "exclusiveMaximum"}, {"maximum", "exclusiveMinimum"},
                                            {"exclusiveMinimum", "maximum"}, {"exclusiveMaximum", "minimum"}};
      const char *to = 0;
      for (uint32_t f = 0; f < 4; f++)
        if (jv_str_is(key, flip[f][0])) to = flip[f][1];
      ok = neg_push(out, typed_kw(T & 64 ? 64 : 32, to, v));
    } else if (jv_str_is(key, "uniqueItems") && v->kind != JV_TRUE) {
      continue;
    } else if (jv_str_is(key, "anyOf") && v->kind == JV_ARR) {
      /* not (A or B): not A and not B, each a union: one disjunct, distributed when merged */
      jv_t *all = jv_new(JV_ARR);
      bool empty = false;
      for (uint32_t a = 0; a < v->n && !empty; a++) {
        const jv_t *nd = sc_negate(c, &v->items[a], depth + 1, U);
        if (!nd) return 0;
        empty = !nd->n;
        jv_t *any = jv_new(JV_OBJ);
        jv_obj_put(any, "anyOf", 5, nd);
        neg_push(all, any);
      }
      if (empty) continue;
      if (T != 127) neg_push(all, typed(T));
      jv_t *o = jv_new(JV_OBJ);
      jv_obj_put(o, "allOf", 5, all);
      ok = neg_push(out, o);
    } else {
      bool other = (sc_in_list(key, STR_KW) && !(T & 16)) || (sc_in_list(key, NUM_KW) && !(T & 96)) ||
                   (sc_in_list(key, ARR_KW) && !(T & 8)) || (sc_in_list(key, OBJ_KW) && !(T & 4));
      if (!other) return 0;            /* oneOf, if/then/else, pattern, ...: not written */
    }
    if (!ok) return 0;
  }
  if (literals && !neg_literals(out, &whole, T, k ? k : e->items, k ? 1 : e->n)) return 0;
  if (whole && !neg_push(out, typed(whole))) return 0;
  return out;
}

/* `s` with its `not` written as the union of its operand's complement (beside the rest, merged
 * as allOf); an error when that complement has no form here. */
const jv_t *sc_without_not(cx_t *c, const jv_t *s) {
  const jv_t *n = s && s->kind == JV_OBJ ? jv_get(s, "not") : 0;
  if (!n || c->err) return s;
  if (sc_ignored(c, "not")) return s;
  uint32_t at = sc_ptr_pushs(c, "not");
  static const char *const drop[] = {"not", 0};
  const jv_t *rest = sc_obj_without(s, drop);
  const jv_t *nd = sc_negate(c, n, 0, sc_kinds_of(c, rest));
  sc_ptr_pop(c, at);
  if (c->err) return 0;
  if (!nd) { UNSUPPORTED(c, "not", "its operand's complement is not expressible here"); return 0; }
  if (!nd->n) return &FALSE_SCHEMA;
  jv_t *any = jv_new(JV_OBJ);
  jv_obj_put(any, "anyOf", 5, nd);
  return rest->n ? sc_all_of2(rest, any) : any;
}

/* Where the compiler stands, to try a form and take it back. */
typedef struct { uint32_t n_keys, ptr_n, log_n, b_n; } mark_t;

static mark_t mark(cx_t *c, const aici_buf_t *b) { return (mark_t){c->n_keys, c->ptr.n, c->out->log.n, b->n}; }

static void take_back(cx_t *c, aici_buf_t *b, mark_t m) {
  aici_free(c->err);
  c->err = 0;
  for (uint32_t i = m.n_keys; i < c->n_keys; i++) aici_free(c->ptrs[i]), aici_free(c->texts[i].text);
  c->n_keys = m.n_keys;
  sc_ptr_pop(c, m.ptr_n);
  c->out->log.n = m.log_n;
  b->n = m.b_n;
  if (b->p) b->p[m.b_n] = 0;
}


/* oneOf exactly, by complements: branch i's alternatives are rest and B_i and, for every other
 * branch j, one disjunct of not B_j (the complements distributed). False, with nothing emitted
 * and no error, when a complement has no form here, the alternatives would be over
 * ONE_OF_TERMS or their text over ONE_OF_BYTES (with the machines they made). */
bool sc_emit_one_of_by_complements(cx_t *c, aici_buf_t *b, const jv_t *alts, const jv_t *rest, bool siblings) {
  uint32_t n = alts->n;
  mark_t m = mark(c, b);
  const jv_t **neg = aici_calloc(n * n, sizeof(void *));   /* neg[i * n + j]: not B_j, within B_i's kinds */
  uint64_t terms = 0;
  bool ok = true;
  uint32_t within = sc_kinds_of(c, rest);
  for (uint32_t i = 0; i < n && ok && terms <= ONE_OF_TERMS; i++) {
    uint32_t U = sc_kinds_of(c, &alts->items[i]) & within;
    uint64_t t = U ? 1 : 0;
    for (uint32_t j = 0; j < n && t && ok; j++)
      if (j != i) {
        ok = (neg[i * n + j] = sc_negate(c, &alts->items[j], 0, U)) != 0;
        if (ok) t *= neg[i * n + j]->n, t = t > ONE_OF_TERMS ? ONE_OF_TERMS + 1 : t;
      }
    terms += t;
  }
  ok = ok && terms <= ONE_OF_TERMS;
  if (!ok) {
    if (c->err) take_back(c, b, m);
    aici_free(neg);
    return false;
  }
  uint32_t *pick = aici_calloc(n, 4);
  aici_buf_puts(b, "(?:");
  bool first = true;
  for (uint32_t i = 0; i < n && !c->err; i++) {
    const jv_t **ng = neg + i * n;
    bool empty = false;
    for (uint32_t j = 0; j < n; j++) empty |= j != i && (!ng[j] || !ng[j]->n), pick[j] = 0;
    if (empty) continue;               /* B_j admits every value B_i may: B_i never alone */
    for (;;) {
      const jv_t *alt = siblings ? sc_all_of2(rest, &alts->items[i]) : &alts->items[i];
      for (uint32_t j = 0; j < n; j++)
        if (j != i) alt = sc_all_of2(alt, &ng[j]->items[pick[j]]);
      uint32_t at = sc_ptr_pushs(c, "oneOf");
      sc_ptr_pushi(c, i);
      if (!sc_obviously_empty(c, alt, 0)) {
        if (!first) aici_buf_putc(b, '|');
        first = false;
        sc_emit(c, b, alt);
      }
      sc_ptr_pop(c, at);
      uint64_t bytes = b->n - m.b_n;
      for (uint32_t k = m.n_keys; k < c->n_keys; k++) bytes += c->texts[k].len;
      if (!c->err && bytes > ONE_OF_BYTES) sc_fail(c, "too large: ", "oneOf", 0);   /* taken back below */
      if (c->err) break;
      uint32_t j = 0;                  /* the next tuple of disjuncts */
      for (; j < n; j++) {
        if (j == i) continue;
        if (++pick[j] < ng[j]->n) break;
        pick[j] = 0;
      }
      if (j == n) break;
    }
  }
  if (first) aici_buf_puts(b, "[^\\x00-\\xff]");
  aici_buf_putc(b, ')');
  aici_free(pick), aici_free(neg);
  if (c->err) { take_back(c, b, m); return false; }
  return true;
}

/* A schema no value meets, by a look at its keywords (false, `type: []`, `enum: []`, literals
 * of none of its types, an object-only schema with a required key whose value is such a schema):
 * alternatives so made are not written (the distributed complements of an exact oneOf make
 * many). False says nothing. */
bool sc_obviously_empty(cx_t *c, const jv_t *s, uint32_t depth) {
  if (depth > 4 || c->err || !s || (s->kind == JV_OBJ && jv_get(s, "$ref"))) return false;
  s = sc_flatten(c, s);
  if (!s || c->err) return false;
  if (s->kind == JV_FALSE) return true;
  if (s->kind != JV_OBJ) return false;
  const jv_t *t = jv_get(s, "type"), *e = jv_get(s, "enum"), *k = jv_get(s, "const");
  uint32_t T = t ? sc_type_bits(t) : 127;
  if (t && !T && t->kind == JV_ARR) return true;
  if (!k && e && e->kind == JV_ARR && (!e->n || !(sc_kinds_of(c, s) & T))) return true;
  if (k && !(sc_kinds_of(c, s) & T)) return true;
  const jv_t *req = jv_get(s, "required");
  for (uint32_t i = 0; T == 4 && req && req->kind == JV_ARR && i < req->n; i++) {
    if (req->items[i].kind != JV_STR) continue;
    const jv_t *v = sc_value_schema(c, s, &req->items[i]);
    if (v && sc_obviously_empty(c, v, depth + 1)) return true;
  }
  return false;
}
