/* allOf merged into one schema where the keywords allow, and the checks that a oneOf's
 * branches cannot both match: part of the schema compiler (schema_int.h). */
#include "schema_int.h"

/* ---- allOf: merged into one schema where the keywords allow ---------------------------------- */
jv_t *sc_obj_without(const jv_t *s, const char *const *drop) {
  jv_t *o = jv_new(JV_OBJ);
  for (uint32_t i = 0; i < s->n; i++)
    if (!sc_in_list(&s->keys[i], drop)) jv_obj_put(o, s->keys[i].s, s->keys[i].n, &s->items[i]);
  return o;
}

jv_t *sc_all_of2(const jv_t *a, const jv_t *b) {
  jv_t *arr = jv_new(JV_ARR);
  arr->n = 2;
  arr->items = aici_malloc(2 * sizeof(jv_t));
  arr->items[0] = *a, arr->items[1] = *b;
  jv_t *o = jv_new(JV_OBJ);
  jv_obj_put(o, "allOf", 5, arr);
  return o;
}

static const jv_t *deref(cx_t *c, const jv_t *s) {
  for (uint32_t guard = 0; s && s->kind == JV_OBJ && guard < 32; guard++) {
    const jv_t *r = jv_get(s, "$ref");
    if (!r) return s;
    bool siblings = false;
    for (uint32_t i = 0; i < s->n; i++) siblings |= !jv_str_is(&s->keys[i], "$ref") && sc_is_constraint_key(&s->keys[i]);
    const jv_t *t = sc_resolve(c, r);
    if (!t) return 0;
    if (siblings) {
      static const char *const drop[] = {"$ref", 0};
      return sc_all_of2(t, sc_obj_without(s, drop));
    }
    s = t;
  }
  if (s && s->kind == JV_OBJ && jv_get(s, "$ref")) { UNSUPPORTED(c, "$ref", "a chain of 32 references"); return 0; }
  return s;
}

uint32_t sc_type_bits(const jv_t *t) {     /* null bool object array string integer number */
  static const char *const names[] = {"null", "boolean", "object", "array", "string", "integer", "number", 0};
  uint32_t bits = 0;
  for (uint32_t k = 0; names[k]; k++) {
    if (t->kind == JV_STR && jv_str_is(t, names[k])) bits |= 1u << k;
    if (t->kind == JV_ARR)
      for (uint32_t i = 0; i < t->n; i++)
        if (jv_str_is(&t->items[i], names[k])) bits |= 1u << k;
  }
  if (bits & 64) bits |= 32;           /* number includes integer */
  return bits;
}

jv_t *sc_types_value(uint32_t bits) {
  static const char *const names[] = {"null", "boolean", "object", "array", "string", "integer", "number"};
  jv_t *arr = jv_new(JV_ARR);
  if (bits & 64) bits &= ~32u;
  for (uint32_t k = 0; k < 7; k++)
    if (bits & (1u << k)) {
      arr->items = aici_realloc(arr->items, (arr->n + 1) * sizeof(jv_t));
      jv_t *v = &arr->items[arr->n++];
      __builtin_memset(v, 0, sizeof *v);
      v->kind = JV_STR, v->s = names[k];
      uint32_t l = 0;
      while (names[k][l]) l++;
      v->n = l;
    }
  return arr;
}

/* The merge of two object schemas; NULL (with c->err) when a keyword pair cannot be merged. */
static jv_t *merge2(cx_t *c, const jv_t *a, const jv_t *b) {
  jv_t *o = jv_new(JV_OBJ);
  static const char *const MAXES[] = {"minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum", 0};
  static const char *const MINS[] = {"maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum", 0};
  static const char *const SAME[] = {"pattern", "format", "multipleOf", "const", "uniqueItems", 0};
  for (uint32_t i = 0; i < a->n; i++) {
    const jv_t *k = &a->keys[i], *va = &a->items[i], *vb = 0;
    for (uint32_t j = 0; j < b->n; j++)
      if (b->keys[j].n == k->n && !__builtin_memcmp(b->keys[j].s, k->s, k->n)) vb = &b->items[j];
    if (!vb || jv_equal(va, vb) || sc_in_list(k, ANNOTATIONS) || !sc_is_constraint_key(k)) {
      if (!jv_str_is(k, "properties")) { jv_obj_put(o, k->s, k->n, va); continue; }
    }
    if (jv_str_is(k, "type")) {
      uint32_t bits = sc_type_bits(va) & sc_type_bits(vb);
      jv_obj_put(o, k->s, k->n, sc_types_value(bits));
    } else if (sc_in_list(k, MAXES) || sc_in_list(k, MINS)) {
      if (va->kind == JV_NUM && vb->kind == JV_NUM) {
        bool take_a = sc_in_list(k, MAXES) ? va->num >= vb->num : va->num <= vb->num;
        jv_obj_put(o, k->s, k->n, take_a ? va : vb);
      } else { UNSUPPORTED(c, "allOf", "boolean exclusive bounds on both sides"); return 0; }
    } else if (jv_str_is(k, "required") || jv_str_is(k, NOT_IN)) {
      jv_t *r = jv_new(JV_ARR);
      uint32_t na = va->kind == JV_ARR ? va->n : 0, nb = vb->kind == JV_ARR ? vb->n : 0;
      r->items = aici_malloc((na + nb + 1) * sizeof(jv_t));
      for (uint32_t x = 0; x < na; x++) r->items[r->n++] = va->items[x];
      for (uint32_t x = 0; x < nb; x++) {
        bool dup = false;
        for (uint32_t y = 0; y < na; y++) dup |= jv_equal(&va->items[y], &vb->items[x]);
        if (!dup) r->items[r->n++] = vb->items[x];
      }
      jv_obj_put(o, k->s, k->n, r);
    } else if (jv_str_is(k, "enum")) {
      jv_t *r = jv_new(JV_ARR);
      if (va->kind == JV_ARR && vb->kind == JV_ARR) {
        r->items = aici_malloc((va->n + 1) * sizeof(jv_t));
        for (uint32_t x = 0; x < va->n; x++)
          for (uint32_t y = 0; y < vb->n; y++)
            if (jv_equal(&va->items[x], &vb->items[y])) { r->items[r->n++] = va->items[x]; break; }
      }
      jv_obj_put(o, k->s, k->n, r);
    } else if (jv_str_is(k, "properties")) {
      /* a key listed on one side only meets the other side's additionalProperties */
      const jv_t *pb = vb && vb->kind == JV_OBJ ? vb : 0, *pa = va->kind == JV_OBJ ? va : 0;
      const jv_t *adda = jv_get(a, "additionalProperties"), *addb = jv_get(b, "additionalProperties");
      jv_t *r = jv_new(JV_OBJ);
      for (uint32_t x = 0; pa && x < pa->n; x++) {
        const jv_t *other = 0;
        for (uint32_t y = 0; pb && y < pb->n; y++)
          if (pb->keys[y].n == pa->keys[x].n && !__builtin_memcmp(pb->keys[y].s, pa->keys[x].s, pa->keys[x].n)) other = &pb->items[y];
        if (!other) other = addb;
        jv_obj_put(r, pa->keys[x].s, pa->keys[x].n, other ? sc_all_of2(&pa->items[x], other) : &pa->items[x]);
      }
      for (uint32_t y = 0; pb && y < pb->n; y++) {
        bool seen = false;
        for (uint32_t x = 0; pa && x < pa->n; x++)
          seen |= pb->keys[y].n == pa->keys[x].n && !__builtin_memcmp(pb->keys[y].s, pa->keys[x].s, pb->keys[y].n);
        if (!seen) jv_obj_put(r, pb->keys[y].s, pb->keys[y].n, adda ? sc_all_of2(&pb->items[y], adda) : &pb->items[y]);
      }
      jv_obj_put(o, k->s, k->n, r);
    } else if (jv_str_is(k, "additionalProperties") || (jv_str_is(k, "items") && va->kind != JV_ARR && vb->kind != JV_ARR) ||
               jv_str_is(k, "additionalItems")) {
      jv_obj_put(o, k->s, k->n, sc_all_of2(va, vb));
    } else if (jv_str_is(k, "anyOf") || jv_str_is(k, "oneOf")) {
      if (va->kind != JV_ARR || vb->kind != JV_ARR || va->n * vb->n > MAX_ALTS) { UNSUPPORTED(c, "allOf", "of two large anyOf/oneOf"); return 0; }
      if (jv_str_is(k, "oneOf")) { UNSUPPORTED(c, "allOf", "of two oneOf"); return 0; }
      jv_t *r = jv_new(JV_ARR);
      r->items = aici_malloc((va->n * vb->n + 1) * sizeof(jv_t));
      for (uint32_t x = 0; x < va->n; x++)
        for (uint32_t y = 0; y < vb->n; y++) r->items[r->n++] = *sc_all_of2(&va->items[x], &vb->items[y]);
      jv_obj_put(o, k->s, k->n, r);
    } else if (sc_in_list(k, SAME) || jv_str_is(k, "items") || jv_str_is(k, "prefixItems")) {
      if (jv_str_is(k, "const")) {     /* two different consts: no value (an empty enum, alone: a
                                        * sibling enum must not be merged over it) */
        jv_t *none = jv_new(JV_OBJ);
        jv_obj_put(none, "enum", 4, jv_new(JV_ARR));
        return none;
      }
      UNSUPPORTED(c, "allOf", "two different values of one keyword");
      return 0;
    } else {                           /* e.g. two patternProperties: not merged, so refused */
      UNSUPPORTED(c, "allOf", "two different values of one keyword");
      return 0;
    }
  }
  for (uint32_t j = 0; j < b->n; j++) {
    const jv_t *k = &b->keys[j];
    bool in_a = false;
    for (uint32_t i = 0; i < a->n; i++) in_a |= a->keys[i].n == k->n && !__builtin_memcmp(a->keys[i].s, k->s, k->n);
    if (in_a) continue;
    if (jv_str_is(k, "properties")) {   /* a's additionalProperties applies to b's keys */
      const jv_t *adda = jv_get(a, "additionalProperties");
      if (adda && b->items[j].kind == JV_OBJ) {
        jv_t *r = jv_new(JV_OBJ);
        for (uint32_t y = 0; y < b->items[j].n; y++)
          jv_obj_put(r, b->items[j].keys[y].s, b->items[j].keys[y].n, sc_all_of2(&b->items[j].items[y], adda));
        jv_obj_put(o, k->s, k->n, r);
        continue;
      }
    }
    jv_obj_put(o, k->s, k->n, &b->items[j]);
  }
  return o;
}

/* allOf (and $ref with siblings) flattened and merged into one schema without allOf/$ref. */
static const jv_t *flatten_in(cx_t *c, const jv_t *s);

const jv_t *sc_flatten(cx_t *c, const jv_t *s) {
  if (c->err) return 0;
  if (!c->fdepth) c->fptr0 = c->ptr.n;
  if (c->fdepth >= FLATTEN_DEPTH_MAX) {
    /* named where the nesting starts: the pointer cut two segments past the outermost allOf */
    uint32_t cut = c->fptr0, seg = 0;
    while (cut < c->ptr.n && seg < 3) seg += c->ptr.p[cut] == '/', cut += seg < 3;
    if (c->ptr.p && cut < c->ptr.n) sc_ptr_pop(c, cut);
    UNSUPPORTED(c, "allOf", "a $ref loop through allOf, or allOf nested over 32 levels");
    return 0;
  }
  c->fdepth++;
  const jv_t *r = flatten_in(c, s);
  c->fdepth--;
  return r;
}

static const jv_t *flatten_in(cx_t *c, const jv_t *s) {
  if (++c->loops > 100000) { UNSUPPORTED(c, "allOf", "merging does not terminate (recursive allOf)"); return 0; }
  s = deref(c, s);
  if (!s || s->kind != JV_OBJ) return s;
  const jv_t *all = jv_get(s, "allOf");
  if (!all) return s;
  if (!sc_check_values(c, s)) return 0;
  static const char *const drop[] = {"allOf", 0};
  const jv_t *acc = sc_obj_without(s, drop);
  for (uint32_t i = 0; i < all->n && acc; i++) {
    uint32_t at = sc_ptr_pushs(c, "allOf");
    sc_ptr_pushi(c, i);
    const jv_t *part = sc_flatten(c, &all->items[i]);
    if (part && part->kind == JV_OBJ && jv_get(part, "not")) part = sc_flatten(c, sc_without_not(c, part));
    if (part && !c->err && !sc_check_keywords(c, part)) part = 0;
    sc_ptr_pop(c, at);
    if (!part) return 0;
    if (part->kind == JV_FALSE) return &FALSE_SCHEMA;
    if (part->kind != JV_OBJ) continue;  /* true */
    acc = merge2(c, acc, part);
    if (acc && jv_get(acc, "$ref")) acc = sc_flatten(c, acc);
  }
  return acc;
}

/* ---- oneOf: only when its branches cannot both match ------------------------------------------- */
static uint32_t kinds_of_at(cx_t *c, const jv_t *s, uint32_t depth);
uint32_t sc_kinds_of(cx_t *c, const jv_t *s) { return kinds_of_at(c, s, 0); }

/* The kinds of value `s` may admit (a superset: deeper than SCAN_DEPTH_MAX, every kind). */
static uint32_t kinds_of_at(cx_t *c, const jv_t *s, uint32_t depth) {
  if (depth > SCAN_DEPTH_MAX) return 127;
  s = deref(c, s);
  if (!s || s->kind == JV_FALSE) return 0;
  if (s->kind != JV_OBJ) return 127;
  uint32_t bits = 127;
  const jv_t *t = jv_get(s, "type"), *e = jv_get(s, "enum"), *k = jv_get(s, "const");
  if (t) bits = sc_type_bits(t);
  if (k) e = 0;
  if (e || k) {
    uint32_t vb = 0;
    for (uint32_t i = 0; e ? i < (e->kind == JV_ARR ? e->n : 0) : i < 1; i++) {
      const jv_t *v = e ? &e->items[i] : k;
      vb |= v->kind == JV_NULL ? 1 : v->kind <= JV_TRUE ? 2 : v->kind == JV_OBJ ? 4 : v->kind == JV_ARR ? 8
          : v->kind == JV_STR ? 16 : jv_is_int(v) ? 96 : 64;
    }
    bits &= vb;
  }
  for (const char *const *kw = (const char *const[]){"anyOf", "oneOf", 0}; *kw; kw++) {
    const jv_t *alts = jv_get(s, *kw);   /* a oneOf's values are some of its anyOf's */
    if (alts && alts->kind == JV_ARR) {
      uint32_t u = 0;
      for (uint32_t i = 0; i < alts->n; i++) u |= kinds_of_at(c, &alts->items[i], depth + 1);
      bits &= u;
    }
  }
  return bits;
}

/* Values listed by enum / const at the top of a schema, or by every branch of its anyOf / oneOf
 * (NULL: not a literal schema). */
static const jv_t *top_literals_at(cx_t *c, const jv_t *s, uint32_t *n, uint32_t depth);
static const jv_t *top_literals(cx_t *c, const jv_t *s, uint32_t *n) { return top_literals_at(c, s, n, 0); }

static const jv_t *top_literals_at(cx_t *c, const jv_t *s, uint32_t *n, uint32_t depth) {
  if (depth > SCAN_DEPTH_MAX) return 0;
  s = deref(c, s);
  if (!s || s->kind != JV_OBJ) return 0;
  const jv_t *k = jv_get(s, "const"), *e = jv_get(s, "enum");
  if (k) { *n = 1; return k; }
  if (e && e->kind == JV_ARR) { *n = e->n; return e->items; }
  const jv_t *alts = jv_get(s, "anyOf");
  if (!alts) alts = jv_get(s, "oneOf");
  if (!alts || alts->kind != JV_ARR || !alts->n) return 0;
  jv_t *all = jv_new(JV_ARR);
  for (uint32_t i = 0; i < alts->n; i++) {
    uint32_t m = 0;
    const jv_t *v = top_literals_at(c, &alts->items[i], &m, depth + 1);
    if (!v) return 0;
    all->items = aici_realloc(all->items, (all->n + m + 1) * sizeof(jv_t));
    for (uint32_t j = 0; j < m; j++) all->items[all->n++] = v[j];
  }
  *n = all->n;
  return all->items;
}

static bool literals_disjoint(cx_t *c, const jv_t *a, const jv_t *b) {
  uint32_t la = 0, lb = 0;
  const jv_t *xa = top_literals(c, a, &la), *xb = top_literals(c, b, &lb);
  if (!xa || !xb) return false;
  for (uint32_t x = 0; x < la; x++)
    for (uint32_t y = 0; y < lb; y++)
      if (jv_equal(&xa[x], &xb[y])) return false;
  return true;
}

/* The schema a key's value meets in object schema `s`: its listed property, else a pattern's
 * it matches (one of them: a superset of their intersection), else additionalProperties; NULL:
 * anything. */
const jv_t *sc_value_schema(cx_t *c, const jv_t *s, const jv_t *key) {
  const jv_t *p = jv_get(s, "properties"), *pp = jv_get(s, "patternProperties");
  for (uint32_t i = 0; p && p->kind == JV_OBJ && i < p->n; i++)
    if (p->keys[i].n == key->n && !__builtin_memcmp(p->keys[i].s, key->s, key->n)) return &p->items[i];
  for (uint32_t i = 0; pp && pp->kind == JV_OBJ && i < pp->n; i++) {
    aici_buf_t t = {0};
    const char *why = 0;
    aici_regex_t *re = emit_pattern(&t, pp->keys[i].s, pp->keys[i].n, &why) ? aici_regex_compile(t.p, t.n, 0) : 0;
    aici_free(t.p);
    if (!re) return 0;                 /* cannot tell whether it matches: anything */
    aici_buf_t k = {0};
    jv_write_str(&k, key->s, key->n);
    uint32_t st = aici_regex_advance(re, aici_regex_start(re), (const uint8_t *)k.p + 1, k.n - 2);
    aici_free(k.p);
    if (st && aici_regex_accepting(re, st)) return &pp->items[i];
  }
  return jv_get(s, "additionalProperties");
}

/* No two values satisfy both (their kinds, or their literals, are disjoint). */
static bool values_disjoint(cx_t *c, const jv_t *a, const jv_t *b) {
  return !(sc_kinds_of(c, a) & sc_kinds_of(c, b)) || literals_disjoint(c, a, b);
}

static bool keys_disjoint(cx_t *c, const jv_t *a, const jv_t *b, const jv_t *req) {
  for (uint32_t i = 0; req && req->kind == JV_ARR && i < req->n; i++) {
    const jv_t *k = &req->items[i];
    if (k->kind != JV_STR) continue;
    const jv_t *va = sc_value_schema(c, a, k), *vb = sc_value_schema(c, b, k);
    if ((va && va->kind == JV_FALSE) || (vb && vb->kind == JV_FALSE)) return true;
    if (va && vb && values_disjoint(c, va, vb)) return true;
  }
  return false;
}

/* No object satisfies both: some key that one of them (or `parent_req`, the oneOf's sibling
 * `required`) requires, so that it is present, has values of disjoint kinds or literals in the
 * two (a key one forbids included). Says nothing of values that are no objects. */
static bool objects_disjoint(cx_t *c, const jv_t *a, const jv_t *b, const jv_t *parent_req) {
  a = deref(c, a), b = deref(c, b);
  if (!a || !b || a->kind != JV_OBJ || b->kind != JV_OBJ) return false;
  return keys_disjoint(c, a, b, jv_get(a, "required")) || keys_disjoint(c, a, b, jv_get(b, "required")) ||
         keys_disjoint(c, a, b, parent_req);
}

/* Every value of kind `kind` (a kinds_of bit) satisfies `s`: no keyword of `s` but `type`
 * applies to that kind (the caller knows `type` admits it). */
static bool admits_every(cx_t *c, const jv_t *s, uint32_t kind) {
  static const char *const OBJ[] = {"properties", "required", "additionalProperties", "patternProperties",
                                    "minProperties", "maxProperties", "dependencies", "dependentRequired",
                                    "dependentSchemas", "propertyNames", "unevaluatedProperties", 0};
  static const char *const ARR[] = {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
                                    "contains", "minContains", "maxContains", "unevaluatedItems", 0};
  static const char *const STR[] = {"minLength", "maxLength", "pattern", "format", NOT_IN, 0};
  static const char *const NUM[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", 0};
  s = deref(c, s);
  if (!s || s->kind == JV_FALSE) return false;
  if (s->kind != JV_OBJ) return true;
  for (uint32_t i = 0; i < s->n; i++) {
    const jv_t *k = &s->keys[i];
    if (!sc_is_constraint_key(k) || jv_str_is(k, "type")) continue;
    bool other = (sc_in_list(k, OBJ) && kind != 4) || (sc_in_list(k, ARR) && kind != 8) || (sc_in_list(k, STR) && kind != 16) ||
                 (sc_in_list(k, NUM) && !(kind & 96));
    if (!other) return false;
  }
  return true;
}

/* oneOf, exactly: for each kind of value two branches both admit, either no value of that kind
 * satisfies both (disjoint literals; for objects, a required key's literals or a required key
 * the other forbids), or both admit every value of that kind, so that no value of it matches
 * exactly one branch: the kind is then taken out of every branch (*excluded gets its bit).
 * False: branches that may overlap otherwise. */
bool sc_one_of_exact(cx_t *c, const jv_t *alts, const jv_t *rest, uint32_t *excluded) {
  *excluded = 0;
  uint32_t within = sc_kinds_of(c, rest);  /* the siblings' kinds: no other value matters */
  const jv_t *parent_req = jv_get(rest, "required");
  for (uint32_t i = 0; i < alts->n; i++)
    for (uint32_t j = i + 1; j < alts->n; j++) {
      const jv_t *a = &alts->items[i], *b = &alts->items[j];
      uint32_t both = sc_kinds_of(c, a) & sc_kinds_of(c, b) & within;
      if (!both || literals_disjoint(c, a, b)) continue;
      for (uint32_t k = 1; k < 128; k <<= 1) {
        if (!(both & k) || (k == 4 && objects_disjoint(c, a, b, parent_req))) continue;
        if (!admits_every(c, a, k) || !admits_every(c, b, k)) return false;
        *excluded |= k;
      }
    }
  /* no type names "numbers that are not integers": integers out, other numbers kept, refused */
  return !((*excluded & 32) && !(*excluded & 64));
}
