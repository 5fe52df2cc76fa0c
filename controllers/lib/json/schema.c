/* JSON Schema -> regex texts for the SDK's DFA engine, one per machine (see json.h).
 *
 * Every keyword is either enforced exactly, narrowed (the controller offers a subset of the
 * valid documents: canonical escapes, no exponent on bounded numbers, properties in schema
 * order), an annotation, or an error "unsupported: KEYWORD at POINTER". Words that are no JSON
 * Schema keyword at all (x-..., javaType) constrain nothing for any validator, so they are
 * skipped like annotations.
 */
#include "json.h"

#define OUTLINE_BYTES 2048u            /* sub-schemas longer than this become machines */
#define MAX_ALTS 64u
#define TEXT_MAX (2u << 20)            /* bytes of regex text over all machines at most */
#define PROPS_MAX 1024u                /* properties (listed and required) of one object at most */
#define FLATTEN_DEPTH_MAX 32u          /* allOf inside allOf (through $ref): a checked limit, not a trap */
#define SCAN_DEPTH_MAX 32u             /* kinds_of / top_literals look no deeper (their answers widen) */
#define STR_INLINE_MIN 128u /* a plain string's minLength inline (one NFA copy a character) up to this */
#define STR_INLINE_MAX 24u  /* and its maxLength; past either, a counted machine */
#define PAT_INLINE_MAX 32u  /* `^ATOM{m,n}$` takes length bounds into its repeat while they are at most this */
#define STR_MAX (1u << 27)          /* counted: a count fits cfg_t.n beside its tracker */
#define PAT_CAP_MAX 128u /* a pattern narrowed to a maxLength: unbounded repeats at most this many more */

typedef struct {
  const jv_t *key;                     /* schema node (or a marker for special machines) */
  uint32_t kind;
  uint64_t arg;                        /* kind 4 (bounded string): min << 32 | max */
} mkey_t;

typedef struct {
  const jv_t *root;
  const json_opts_t *o;
  compiled_t *out;
  mkey_t *keys;
  const jv_t **pending;                /* schema of machine i still to compile (NULL: done) */
  char **ptrs;                         /* JSON pointer of machine i's schema */
  machine_src_t *texts;                /* machine i's regex */
  uint32_t n_keys;
  char *err;
  sb_t ptr;                            /* where the compiler is, as a JSON pointer */
  char ws[40];
  uint32_t loops;
  uint32_t depth;                      /* nesting of emit(): recursion through allOf is bounded */
  uint32_t fdepth, fptr0;              /* nesting of flatten() ($ref loops through allOf), and the
                                          pointer's length where the outermost began */
  uint64_t flat_cap;                   /* checking literals (0: off): strings inline, length bounds
                                          clamped to this (one more than the longest literal) */
} cx_t;

static const jv_t FALSE_SCHEMA = {.kind = JV_FALSE};
static const jv_t ANY_MARK = {.kind = JV_TRUE};

/* ---- errors and pointers --------------------------------------------------------------------- */
static void fail(cx_t *c, const char *what, const char *kw, const char *detail) {
  if (c->err) return;
  sb_t m = {0};
  sb_puts(&m, what);
  sb_puts(&m, kw);
  sb_puts(&m, " at ");
  sb_puts(&m, c->ptr.n ? c->ptr.p : "#");
  if (detail) sb_puts(&m, " ("), sb_puts(&m, detail), sb_putc(&m, ')');
  c->err = m.p;
}
#define UNSUPPORTED(c, kw, detail) fail(c, "unsupported: ", kw, detail)

static uint32_t ptr_push(cx_t *c, const char *seg, uint32_t n) {
  uint32_t at = c->ptr.n;
  if (!c->ptr.n) sb_putc(&c->ptr, '#');
  sb_putc(&c->ptr, '/');
  for (uint32_t i = 0; i < n; i++) {
    if (seg[i] == '~') sb_puts(&c->ptr, "~0");
    else if (seg[i] == '/') sb_puts(&c->ptr, "~1");
    else sb_putc(&c->ptr, seg[i]);
  }
  return at;
}
static uint32_t ptr_pushs(cx_t *c, const char *seg) {
  uint32_t n = 0;
  while (seg[n]) n++;
  return ptr_push(c, seg, n);
}
static uint32_t ptr_pushi(cx_t *c, uint32_t i) {
  char t[12];
  int k = 0;
  do t[k++] = (char)('0' + i % 10), i /= 10; while (i);
  char s[12];
  for (int j = 0; j < k; j++) s[j] = t[k - 1 - j];
  return ptr_push(c, s, (uint32_t)k);
}
static void ptr_pop(cx_t *c, uint32_t at) {
  c->ptr.n = at;
  if (c->ptr.p) c->ptr.p[at] = 0;
}

static bool ignored(cx_t *c, const char *kw) {
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

static void relax(cx_t *c, const char *kw) {
  sb_t *l = &c->out->log;
  sb_puts(l, "json: not enforcing ");
  sb_puts(l, kw);
  sb_puts(l, " at ");
  sb_puts(l, c->ptr.n ? c->ptr.p : "#");
  sb_puts(l, " (option ignore)\n");
}

/* Internal keyword of complements (negate): strings other than those listed (a JSON array).
 * Merged by union; written as a pattern, or checked directly against enum/const literals. No
 * schema spells it (it starts with a control character). */
#define NOT_IN "\x01not-in"
#define NOT_IN_LEN 7u

/* ---- keywords -------------------------------------------------------------------------------- */
static const char *const ANNOTATIONS[] = {
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

static bool in_list(const jv_t *k, const char *const *l) {
  for (; *l; l++)
    if (jv_str_is(k, *l)) return true;
  return false;
}

static bool is_constraint_key(const jv_t *k) { return !in_list(k, ANNOTATIONS) && (in_list(k, HANDLED) || in_list(k, UNSUPPORTED_KWS)); }

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
  if (in_list(k, NUMS)) return v->kind == JV_NUM ? 0 : "not a number";
  if (jv_str_is(k, "exclusiveMinimum") || jv_str_is(k, "exclusiveMaximum"))
    return v->kind == JV_NUM || v->kind == JV_TRUE || v->kind == JV_FALSE ? 0 : "not a number";
  if (jv_str_is(k, "multipleOf")) return v->kind == JV_NUM && v->num > 0 ? 0 : "not a number above 0";
  if (in_list(k, COUNTS)) return v->kind == JV_NUM && jv_is_int(v) && v->num >= 0 ? 0 : "not a non-negative integer";
  if (in_list(k, SCHEMA_MAPS)) {
    if (v->kind != JV_OBJ) return "not an object";
    for (uint32_t i = 0; i < v->n; i++) {
      const jv_t *x = &v->items[i];
      if (x->kind != JV_OBJ && x->kind != JV_TRUE && x->kind != JV_FALSE) return "a value that is no schema";
    }
    return 0;
  }
  if (in_list(k, SCHEMAS)) return is_schema ? 0 : "not a schema (an object or a boolean)";
  if (in_list(k, LISTS)) {
    if (v->kind != JV_ARR || !v->n) return "not a non-empty array";
    for (uint32_t i = 0; i < v->n; i++)
      if (v->items[i].kind != JV_OBJ && v->items[i].kind != JV_TRUE && v->items[i].kind != JV_FALSE) return "an item that is no schema";
    return 0;
  }
  if (in_list(k, STRINGS)) return v->kind == JV_STR ? 0 : "not a string";
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
static bool check_values(cx_t *c, const jv_t *s) {
  for (uint32_t i = 0; s && s->kind == JV_OBJ && i < s->n; i++) {
    const char *bad = malformed(&s->keys[i], &s->items[i]);
    if (!bad) continue;
    uint32_t at = ptr_push(c, s->keys[i].s, s->keys[i].n);
    fail(c, "bad schema: ", "value", bad);
    ptr_pop(c, at);
    return false;
  }
  return true;
}

/* Errors for keywords the compiler cannot enforce (unless ignored on request), and for
 * keyword values of the wrong kind. */
static bool check_keywords(cx_t *c, const jv_t *s) {
  if (!check_values(c, s)) return false;
  for (uint32_t i = 0; i < s->n; i++) {
    const jv_t *k = &s->keys[i], *v = &s->items[i];
    const char *kw = 0;
    for (const char *const *l = UNSUPPORTED_KWS; *l && !kw; l++)
      if (jv_str_is(k, *l)) kw = *l;
    if (jv_str_is(k, "uniqueItems") && v->kind == JV_TRUE) kw = "uniqueItems";
    if (jv_str_is(k, "required") && v->kind == JV_TRUE) kw = "required";   /* draft 3's boolean form */
    if (!kw) continue;
    if (ignored(c, kw)) { relax(c, kw); continue; }
    UNSUPPORTED(c, kw, 0);
    return false;
  }
  return true;
}

/* ---- $ref ------------------------------------------------------------------------------------ */
static bool seg_eq(const jv_t *k, const char *s, uint32_t n) {
  sb_t d = {0};                        /* the segment with ~1 ~0 and %25-style escapes undone */
  for (uint32_t i = 0; i < n; i++) {
    if (s[i] == '~' && i + 1 < n) { sb_putc(&d, s[i + 1] == '1' ? '/' : '~'); i++; }
    else if (s[i] == '%' && i + 2 < n) {
      int h = s[i + 1], l = s[i + 2];
      h = h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10, l = l <= '9' ? l - '0' : (l | 0x20) - 'a' + 10;
      sb_putc(&d, (char)(h * 16 + l));
      i += 2;
    } else sb_putc(&d, s[i]);
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
    if (v->kind == JV_OBJ && in_list(&v->keys[i], DATA)) continue;
    const jv_t *f = find_anchor(&v->items[i], name, n, depth + 1);
    if (f) return f;
  }
  return 0;
}

static const jv_t *resolve(cx_t *c, const jv_t *ref) {
  if (ref->kind != JV_STR || !ref->n || ref->s[0] != '#') {
    UNSUPPORTED(c, "$ref", "only local references (#...) are supported");
    return 0;
  }
  const jv_t *v = c->root;
  const char *s = ref->s + 1, *end = ref->s + ref->n;
  while (s < end) {
    if (*s != '/') {                   /* a plain name: an anchor */
      const jv_t *a = v == c->root ? find_anchor(c->root, s, (uint32_t)(end - s), 0) : 0;
      if (!a) fail(c, "bad schema: ", "$ref", "no such anchor");
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
    if (!next) { fail(c, "bad schema: ", "$ref", "no such location"); return 0; }
    v = next;
  }
  return v;
}

/* ---- machines -------------------------------------------------------------------------------- */
static uint64_t key_arg;               /* the arg of the next machine_find / machine_for */

static int32_t machine_find(cx_t *c, const jv_t *schema, uint32_t kind) {
  for (uint32_t i = 0; i < c->n_keys; i++)
    if (c->keys[i].key == schema && c->keys[i].kind == kind && c->keys[i].arg == key_arg) return (int32_t)i;
  return -1;
}

/* The machine for (schema, kind), created pending; `ptr` names it in errors (NULL: here). */
static uint32_t machine_for(cx_t *c, const jv_t *schema, uint32_t kind, const char *ptr, uint32_t ptr_len) {
  int32_t found = machine_find(c, schema, kind);
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
  sb_t p = {0};
  if (ptr) sb_putn(&p, ptr, ptr_len);
  else sb_puts(&p, c->ptr.n ? c->ptr.p : "#");
  c->ptrs[i] = p.p;
  return i;
}

static void set_text(cx_t *c, uint32_t m, const char *text, uint32_t n) {
  char *t = aici_malloc(n + 1);
  __builtin_memcpy(t, text, n);
  t[n] = 0;
  c->texts[m].text = t, c->texts[m].len = n;
  c->pending[m] = 0;
}

static void emit_call(cx_t *c, sb_t *b, uint32_t m) {
  sb_puts(b, "(?:");
  sb_byte(b, CALL_BYTE), sb_byte(b, (uint8_t)(m >> 8)), sb_byte(b, (uint8_t)m);
  sb_putc(b, ')');
}

static void emit(cx_t *c, sb_t *b, const jv_t *s);
static void emit_value_within(cx_t *c, sb_t *b, const jv_t *s, uint32_t inline_max);
static void emit_value(cx_t *c, sb_t *b, const jv_t *s) { emit_value_within(c, b, s, OUTLINE_BYTES); }
static jv_t *all_of2(const jv_t *a, const jv_t *b);
static const jv_t *without_not(cx_t *c, const jv_t *s);

/* A sub-schema inline, or as a call when its text is over `inline_max` bytes (cut out into its
 * own machine). */
static void emit_value_within(cx_t *c, sb_t *b, const jv_t *s, uint32_t inline_max) {
  int32_t known = machine_find(c, s, 3);
  if (known >= 0) { emit_call(c, b, (uint32_t)known); return; }
  uint32_t at = b->n;
  emit(c, b, s);
  if (c->err || b->n - at <= inline_max) return;
  for (uint32_t i = 0; i < c->n_keys; i++)   /* the same text from another schema node: one machine */
    if (c->texts[i].text && !c->texts[i].counted && c->texts[i].len == b->n - at &&
        !__builtin_memcmp(c->texts[i].text, b->p + at, b->n - at)) {
      b->n = at, b->p[at] = 0;
      emit_call(c, b, i);
      return;
    }
  uint32_t m = machine_for(c, s, 3, 0, 0);
  if (c->err) return;
  set_text(c, m, b->p + at, b->n - at);
  b->n = at, b->p[at] = 0;
  emit_call(c, b, m);
}

/* ---- strings --------------------------------------------------------------------------------- */
/* `one` (a regex) min..max times (unbounded: min or more), in repeats of at most 1000 (the SDK's
 * limit). */
static void emit_repeat(sb_t *b, const sb_t *one, uint64_t min, uint64_t max, bool unbounded) {
  for (; min > 1000; min -= 1000, max -= 1000) sb_putn(b, one->p, one->n), sb_puts(b, "{1000}");
  if (unbounded) {
    sb_putn(b, one->p, one->n), sb_putc(b, '{'), sb_uint(b, min), sb_puts(b, ",}");
  } else {
    uint64_t more = max - min, m = more < 1000 - min ? more : 1000 - min;
    sb_putn(b, one->p, one->n), sb_putc(b, '{'), sb_uint(b, min), sb_putc(b, ','), sb_uint(b, min + m), sb_putc(b, '}');
    for (more -= m; more; more -= m) {
      m = more < 1000 ? more : 1000;
      sb_putn(b, one->p, one->n), sb_puts(b, "{0,"), sb_uint(b, m), sb_putc(b, '}');
    }
  }
}

static void emit_chars(sb_t *b, uint64_t min, uint64_t max, bool unbounded) {
  sb_t one = {0};
  emit_strchar(&one);
  emit_repeat(b, &one, min, max, unbounded);
  aici_free(one.p);
}

/* Calendar dates exactly (days per month, February 29 in leap years only, no year 0), as
 * Python's date.fromisoformat; no leap second (:60), which datetime rejects. */
static const char DATE[] =
  "(?:(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])\\-(?:(?:0[13578]|1[02])\\-(?:0[1-9]|[12][0-9]|3[01])"
  "|(?:0[469]|11)\\-(?:0[1-9]|[12][0-9]|30)|02\\-(?:0[1-9]|1[0-9]|2[0-8]))"
  "|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)\\-02\\-29)";
static const char TIME[] = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?"
                           "(?:[Zz]|[+\\-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
static const char H4[] = "[0-9a-fA-F]{1,4}";
static const char LABEL[] = "[a-zA-Z0-9](?:[a-zA-Z0-9\\-]{0,61}[a-zA-Z0-9])?";
static const char ATEXT[] = "[a-zA-Z0-9!#$%&'*+/=?\\^_`{|}~\\-]+";
static const char URICH[] = "(?:[a-zA-Z0-9\\-._~:/?#\\[\\]@!$&'()*+,;=]|%[0-9a-fA-F]{2})";

static bool emit_format(sb_t *b, const char *f) {
  uint32_t n = 0;
  while (f[n]) n++;
#define IS(s) (n == sizeof(s) - 1 && !__builtin_memcmp(f, s, n))
  if (IS("date")) sb_puts(b, DATE);
  else if (IS("time")) sb_puts(b, TIME);
  else if (IS("date-time")) sb_puts(b, DATE), sb_puts(b, "[Tt]"), sb_puts(b, TIME);
  else if (IS("uuid"))
    sb_puts(b, "[0-9a-fA-F]{8}\\-[0-9a-fA-F]{4}\\-[0-9a-fA-F]{4}\\-[0-9a-fA-F]{4}\\-[0-9a-fA-F]{12}");
  else if (IS("email")) {
    sb_puts(b, ATEXT), sb_puts(b, "(?:\\."), sb_puts(b, ATEXT), sb_puts(b, ")*@");
    sb_puts(b, LABEL), sb_puts(b, "(?:\\."), sb_puts(b, LABEL), sb_puts(b, ")+");
  } else if (IS("hostname")) {
    sb_puts(b, LABEL), sb_puts(b, "(?:\\."), sb_puts(b, LABEL), sb_puts(b, ")*");
  } else if (IS("ipv4")) {
    const char *o = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    sb_puts(b, o);
    for (int i = 0; i < 3; i++) sb_puts(b, "\\."), sb_puts(b, o);
  } else if (IS("ipv6")) {
    sb_puts(b, "(?:");
    /* k groups, "::", then up to 7-k groups (k = 0..7), or all eight groups */
    sb_puts(b, "(?:"), sb_puts(b, H4), sb_puts(b, ":){7}"), sb_puts(b, H4);
    for (int k = 0; k <= 7; k++) {
      sb_putc(b, '|');
      if (k) sb_puts(b, "(?:"), sb_puts(b, H4), sb_puts(b, ":){"), sb_uint(b, (uint64_t)k), sb_putc(b, '}');
      else sb_putc(b, ':');
      if (7 - k > 0) sb_puts(b, "(?::"), sb_puts(b, H4), sb_puts(b, "){0,"), sb_uint(b, (uint64_t)(7 - k)), sb_puts(b, "}");
      if (!k) sb_puts(b, "(?::|(?::"), sb_puts(b, H4), sb_puts(b, ")+)"), b->n -= 0;
    }
    sb_putc(b, ')');
  } else if (IS("uri")) {
    sb_puts(b, "[a-zA-Z][a-zA-Z0-9+.\\-]*:"), sb_puts(b, URICH), sb_putc(b, '+');
  } else return false;
  return true;
#undef IS
}

/* format email within maxLength `max`: the same shape with its repeats bounded, so that no
 * match is longer (narrower than the format: the local part, the labels and their count sized to
 * fit, the roomiest shape first). False when even a small address does not fit. */
static bool emit_email_within(sb_t *b, uint64_t max) {
  /* (u, k): local parts of 1 + u atoms (an atom: a character or `.` and one), labels of k */
  static const uint32_t shapes[][2] = {{62, 63}, {31, 63}, {31, 40}, {31, 24}, {20, 24}, {15, 16}, {8, 10}, {4, 6}, {2, 3}};
  const uint32_t n_shapes = sizeof shapes / sizeof shapes[0];
  for (uint32_t i = 0; i < 2 * n_shapes; i++) {   /* at least 2 labels after the first, else 1 */
    uint64_t u = shapes[i % n_shapes][0], k = shapes[i % n_shapes][1], fixed = 2 + 2 * u + k;
    if (max < fixed + k + 1) continue;
    uint64_t d = (max - fixed) / (k + 1);
    if (d < (i < n_shapes ? 2u : 1u)) continue;
    if (d > 127) d = 127;
    const char *atext = "[a-zA-Z0-9!#$%&'*+/=?\\^_`{|}~\\-]";
    sb_puts(b, atext), sb_puts(b, "(?:"), sb_puts(b, atext), sb_puts(b, "|\\."), sb_puts(b, atext);
    sb_puts(b, "){0,"), sb_uint(b, u), sb_puts(b, "}@");
    sb_t label = {0};
    sb_puts(&label, "[a-zA-Z0-9](?:[a-zA-Z0-9\\-]{0,"), sb_uint(&label, k - 2), sb_puts(&label, "}[a-zA-Z0-9])?");
    sb_putn(b, label.p, label.n), sb_puts(b, "(?:\\."), sb_putn(b, label.p, label.n);
    sb_puts(b, "){1,"), sb_uint(b, d), sb_putc(b, '}');
    aici_free(label.p);
    return true;
  }
  return false;
}

static bool get_uint(cx_t *c, const jv_t *s, const char *kw, uint64_t *out) {
  const jv_t *v = jv_get(s, kw);
  if (!v) return false;
  if (v->kind != JV_NUM || v->num < 0 || !jv_is_int(v)) { fail(c, "bad schema: ", kw, "not a non-negative integer"); return false; }
  *out = v->num > 1e15 ? (uint64_t)1e15 : (uint64_t)v->num;
  return true;
}

/* A pattern `^ATOM{a,b}$` (or * + ?) with length bounds: the same pattern with the repeat
 * narrowed to the bounds (each repeat of one atom is one character). NULL: not of that form. */
static char *pattern_with_length(const jv_t *pat, uint64_t min, uint64_t max, bool has_max, uint64_t *largest) {
  const char *p = pat->s;
  uint32_t n = pat->n, i = 0;
  if (n < 3 || p[0] != '^' || p[n - 1] != '$' || (n >= 2 && p[n - 2] == '\\')) return 0;
  i = 1;
  uint32_t atom = i;
  if (p[i] == '[') {
    for (i++; i < n - 1 && p[i] != ']'; i++)
      if (p[i] == '\\') i++;
    if (i >= n - 1) return 0;
    i++;
  } else if (p[i] == '\\' && i + 1 < n - 1 && ((p[i + 1] | 0x20) == 'd' || (p[i + 1] | 0x20) == 'w' || (p[i + 1] | 0x20) == 's')) i += 2;
  else if (p[i] == '.') i++;
  else return 0;
  uint32_t atom_end = i;
  uint64_t a = 0, b = 0;
  bool unbounded = false;
  if (p[i] == '*') unbounded = true, i++;
  else if (p[i] == '+') a = 1, unbounded = true, i++;
  else if (p[i] == '?') b = 1, i++;
  else if (p[i] == '{') {
    i++;
    while (p[i] >= '0' && p[i] <= '9') a = a * 10 + (uint64_t)(p[i++] - '0');
    b = a;
    if (p[i] == ',') {
      i++;
      if (p[i] == '}') unbounded = true;
      else { b = 0; while (p[i] >= '0' && p[i] <= '9') b = b * 10 + (uint64_t)(p[i++] - '0'); }
    }
    if (p[i] != '}') return 0;
    i++;
  } else return 0;
  if (i != n - 1) return 0;
  if (min > a) a = min;
  if (has_max && (unbounded || max < b)) b = max, unbounded = false;
  *largest = unbounded || b < a ? a : b;
  sb_t t = {0};
  sb_putc(&t, '^'), sb_putn(&t, p + atom, atom_end - atom);
  sb_putc(&t, '{'), sb_uint(&t, a);
  if (unbounded) sb_putc(&t, ',');
  else if (b != a) sb_putc(&t, ','), sb_uint(&t, b < a ? a : b);
  sb_puts(&t, "}$");
  if (!unbounded && b < a) { aici_free(t.p); sb_t e = {0}; sb_puts(&e, "^[]$"); return e.p; }
  return t.p;
}

/* Shortest and longest match of a regex text, in bytes (max UINT64_MAX: unbounded or too big
 * to tell). Depth-first over the DFA: a state on the current path again is a loop. */
#define LEN_STATES 1024u
typedef struct { aici_regex_t *re; uint64_t *memo; uint8_t *mark; bool failed; } lens_t;

static uint64_t longest(lens_t *l, uint32_t s, uint32_t depth) {
  if (s >= LEN_STATES || depth > 256) { l->failed = true; return 0; }
  if (l->mark[s] == 2) return l->memo[s];
  if (l->mark[s] == 1) { l->failed = true; return 0; }   /* a loop */
  l->mark[s] = 1;
  uint64_t best = 0;
  for (uint32_t byte = 0; byte < 256 && !l->failed; byte++) {
    uint32_t t = aici_regex_step(l->re, s, (uint8_t)byte);
    if (t) {
      uint64_t v = 1 + longest(l, t, depth + 1);
      if (v > best) best = v;
    }
  }
  l->mark[s] = 2, l->memo[s] = best;
  return best;
}

static void length_bounds(const char *text, uint32_t len, uint64_t *min, uint64_t *max) {
  *min = 0, *max = UINT64_MAX;
  aici_regex_t *re = aici_regex_compile(text, len, 0);
  if (!re) return;
  uint32_t q[LEN_STATES], d[LEN_STATES], n = 1;
  uint8_t seen[LEN_STATES] = {0};
  q[0] = aici_regex_start(re), d[0] = 0;
  if (q[0] < LEN_STATES) seen[q[0]] = 1;
  for (uint32_t i = 0; i < n; i++) {       /* breadth first: the shortest match */
    if (aici_regex_accepting(re, q[i])) { *min = d[i]; break; }
    for (uint32_t byte = 0; byte < 256; byte++) {
      uint32_t t = aici_regex_step(re, q[i], (uint8_t)byte);
      if (!t || t >= LEN_STATES || seen[t] || n == LEN_STATES) continue;
      seen[t] = 1, q[n] = t, d[n++] = d[i] + 1;
    }
  }
  lens_t l = {re, aici_calloc(LEN_STATES, 8), aici_calloc(LEN_STATES, 1), false};
  uint64_t v = longest(&l, aici_regex_start(re), 0);
  if (!l.failed) *max = v;
  aici_free(l.memo), aici_free(l.mark);
}

enum { MK_KEYLANG = 8, MK_ANY_ORDER = 9, MK_COUNTED = 10 };

/* A length-counted string machine (machine_src_t.counted): `"`, the content regex, `"`, and
 * lo..hi characters (CHARS_UNBOUNDED: no maximum), one per (key, bounds). The matcher counts
 * beside the DFA state, so nothing here grows with the bounds. */
static void emit_counted(cx_t *c, sb_t *b, const jv_t *key, const sb_t *content, uint64_t lo, uint64_t hi) {
  key_arg = lo << 32 | hi;
  int32_t m = machine_find(c, key, MK_COUNTED);
  sb_t t = {0};
  sb_puts(&t, "\\x22"), sb_putn(&t, content->p, content->n), sb_puts(&t, "\\x22");
  for (uint32_t i = 0; m < 0 && i < c->n_keys; i++)   /* the same machine from another schema node */
    if (c->texts[i].counted && c->texts[i].lo == lo && c->texts[i].hi == hi && c->texts[i].len == t.n &&
        !__builtin_memcmp(c->texts[i].text, t.p, t.n))
      m = (int32_t)i;
  if (m < 0) {
    m = (int32_t)machine_for(c, key, MK_COUNTED, 0, 0);
    if (!c->err) {
      set_text(c, (uint32_t)m, t.p, t.n);
      c->texts[m].counted = true, c->texts[m].lo = (uint32_t)lo, c->texts[m].hi = (uint32_t)hi;
    }
  }
  aici_free(t.p);
  key_arg = 0;
  if (!c->err) emit_call(c, b, (uint32_t)m);
}

/* `pattern` beside `format`: exact where one's language lies inside the other's (the inner one is
 * then the string's language: `^[a-z]+@[a-z]+\.com$` beside `format: email`); else an error. */
static bool emit_keylang(cx_t *c, sb_t *b, const sb_t *pats, uint32_t n_pats, int32_t target, const sb_t *keys);

/* `pattern` beside `format` (true: both stay, to be intersected, when `intersect`; else an
 * error). */
static bool pattern_beside_format(cx_t *c, const jv_t **pat, const jv_t **fmt, bool intersect) {
  if (!*pat || !*fmt || (*pat)->kind != JV_STR) return false;
  sb_t p = {0}, f = {0};
  const char *why = 0;
  bool ok = emit_pattern_capped(&p, (*pat)->s, (*pat)->n, PAT_NO_CAP, 0, 0, 0, &why) && emit_format(&f, (*fmt)->s);
  if (ok && regex_subset(p.p, p.n, f.p, f.n)) *fmt = 0;
  else if (ok && regex_subset(f.p, f.n, p.p, p.n)) *pat = 0;
  else if (!ok || !intersect) UNSUPPORTED(c, "format", "together with pattern, neither language inside the other's");
  aici_free(p.p), aici_free(f.p);
  return *pat && *fmt && !c->err;
}

/* A string in both the pattern's and the format's language: their product automaton
 * (keylang.c, at most KEYLANG_STATES states), no length bounds beside (a counted machine takes
 * one regex). */
static void emit_pattern_and_format(cx_t *c, sb_t *b, const jv_t *pat, const jv_t *fmt) {
  sb_t pats[2] = {{0}, {0}}, none = {0};
  const char *why = 0;
  if (!emit_pattern_capped(&pats[0], pat->s, pat->n, PAT_NO_CAP, 0, 0, 0, &why) || !emit_format(&pats[1], fmt->s)) {
    UNSUPPORTED(c, "pattern", why ? why : "?");
  } else {
    sb_t content = {0};
    if (!emit_keylang(c, &content, pats, 2, KEYLANG_ALL, &none))
      UNSUPPORTED(c, "format", "together with pattern: their product has over 1024 states");
    else sb_puts(b, "\\x22"), sb_putn(b, content.p, content.n), sb_puts(b, "\\x22");
    aici_free(content.p);
  }
  aici_free(pats[0].p), aici_free(pats[1].p);
}

/* Strings while literals are checked (c->flat_cap: one regex, no machine, so no counting): a
 * `maxLength` a pattern does not imply caps its unbounded repeats and unanchored ends, a
 * `minLength` it does not imply is taken by its unanchored end (narrower: some valid literals
 * dropped, never an invalid one kept). */
static void emit_string_flat(cx_t *c, sb_t *b, const jv_t *s) {
  uint64_t min = 0, max = 0;
  bool has_min = get_uint(c, s, "minLength", &min), has_max = get_uint(c, s, "maxLength", &max);
  const jv_t *pat = jv_get(s, "pattern"), *fmt = jv_get(s, "format");
  if (fmt && fmt->kind == JV_STR && ignored(c, "format")) { relax(c, "format"); fmt = 0; }
  if (fmt && fmt->kind != JV_STR) fmt = 0;
  if (has_max && max < min) { sb_puts(b, "[^\\x00-\\xff]"); return; }
  if (c->flat_cap) {                   /* for literals of fewer characters: the same verdicts */
    if (min > c->flat_cap) min = c->flat_cap;
    if (has_max && max > c->flat_cap) max = c->flat_cap;
  }
  sb_puts(b, "\\x22");
  if (pat || fmt) {
    pattern_beside_format(c, &pat, &fmt, false);
    if (c->err) return;
    if (pat && pat->kind != JV_STR) { fail(c, "bad schema: ", "pattern", "not a string"); return; }
    jv_t narrowed = {0};
    if (pat && ((has_min && min > 0) || has_max)) {
      uint64_t largest;
      char *t = pattern_with_length(pat, has_min ? min : 0, max, has_max, &largest);
      if (t) {
        uint32_t k = 0;
        while (t[k]) k++;
        narrowed.kind = JV_STR, narrowed.s = t, narrowed.n = k;
        pat = &narrowed, has_min = has_max = false;
      }
    }
    uint64_t cap = PAT_NO_CAP, end_min = 0;   /* a pattern's lengths in characters, exactly */
    if (pat && ((has_min && min > 0) || has_max)) {
      sb_t t = {0};
      uint64_t lo = 0, hi = 0;
      const char *why = 0;
      if (emit_pattern_capped(&t, pat->s, pat->n, PAT_NO_CAP, 0, &lo, &hi, &why)) {
        if (has_min && lo < min) {     /* narrower: an unanchored end takes the missing length */
          uint64_t lo2 = 0;
          t.n = 0;
          emit_pattern_capped(&t, pat->s, pat->n, PAT_NO_CAP, min - lo, &lo2, &hi, &why);
          if (lo2 >= min) end_min = min - lo, lo = lo2;
        }
        if (has_min && lo >= min) has_min = false;
        if (has_max && hi <= max) has_max = false;
        for (uint64_t a = 0, z = PAT_CAP_MAX + 1; has_max && a < z;) {
          /* narrower: the unbounded repeats at most `cap` more, the largest cap that fits */
          uint64_t mid = (a + z) / 2;
          t.n = 0;
          emit_pattern_capped(&t, pat->s, pat->n, mid, end_min, &lo, &hi, &why);
          if (hi <= max) cap = mid, a = mid + 1;
          else z = mid;
          if (a >= z && cap != PAT_NO_CAP) has_max = false;
        }
      }
      aici_free(t.p);
    }
    bool email_within = false;         /* a bounded email: its own narrower shape */
    if (fmt && has_max && !pat && jv_str_is(fmt, "email")) {
      sb_t t = {0};
      email_within = emit_email_within(&t, max);
      aici_free(t.p);
      has_max = !email_within;
    }
    if ((has_min && min > 0) || has_max) {
      /* length bounds the pattern or format already implies: characters <= bytes, and a
       * format's text is ASCII (one byte a character) */
      sb_t t = {0};
      const char *why = 0;
      bool ok = pat ? emit_pattern(&t, pat->s, pat->n, &why) : emit_format(&t, fmt->s);
      uint64_t lo, hi;
      if (ok) {
        length_bounds(t.p, t.n, &lo, &hi);
        if (has_max && hi <= max) has_max = false;
        if (has_min && (min <= (pat ? (lo > 0) : lo))) has_min = false;
      }
      aici_free(t.p);
    }
    if ((has_min && min > 0) || has_max) { UNSUPPORTED(c, has_max ? "maxLength" : "minLength", pat ? "together with pattern" : "together with format"); return; }
    if (pat) {
      const char *why = 0;
      uint32_t at = ptr_pushs(c, "pattern");
      if (!emit_pattern_capped(b, pat->s, pat->n, cap, end_min, 0, 0, &why)) UNSUPPORTED(c, "pattern", why);
      ptr_pop(c, at);
    } else if (email_within) {
      emit_email_within(b, max);
    } else if (!emit_format(b, fmt->s)) {
      uint32_t at = ptr_pushs(c, "format");
      UNSUPPORTED(c, "format", fmt->s);
      ptr_pop(c, at);
    }
  } else {
    if (min > STR_MAX || (has_max && max > STR_MAX)) {
      UNSUPPORTED(c, has_max && max > STR_MAX ? "maxLength" : "minLength", "over 134217728");
      return;
    }
    emit_chars(b, min, max, !has_max);
  }
  sb_puts(b, "\\x22");
}

/* Strings: the content's language (a pattern, a format, any characters), and length bounds in
 * characters, exactly. Bounds the language implies cost nothing; `^ATOM{m,n}$` takes small
 * ones into its repeat; any other is a counted machine (emit_counted), whatever its size. */
static void emit_string(cx_t *c, sb_t *b, const jv_t *s) {
  if (c->flat_cap) { emit_string_flat(c, b, s); return; }
  uint64_t min = 0, max = 0;
  bool has_min = get_uint(c, s, "minLength", &min), has_max = get_uint(c, s, "maxLength", &max);
  const jv_t *pat = jv_get(s, "pattern"), *fmt = jv_get(s, "format");
  if (fmt && fmt->kind == JV_STR && ignored(c, "format")) { relax(c, "format"); fmt = 0; }
  if (fmt && fmt->kind != JV_STR) fmt = 0;
  if (c->err) return;
  if (has_max && max < min) { sb_puts(b, "[^\\x00-\\xff]"); return; }
  if (has_min && !min) has_min = false;
  sb_puts(b, "\\x22");
  sb_t content = {0};
  jv_t narrowed = {0};
  if (pat || fmt) {
    if (pattern_beside_format(c, &pat, &fmt, true)) {
      if (has_min || has_max) {
        UNSUPPORTED(c, has_max ? "maxLength" : "minLength", "beside both a pattern and a format, neither inside the other");
        return;
      }
      b->n -= 4, b->p[b->n] = 0;       /* (the opening quote: written with the content) */
      emit_pattern_and_format(c, b, pat, fmt);
      return;
    }
    if (c->err) return;
    if (pat && pat->kind != JV_STR) { fail(c, "bad schema: ", "pattern", "not a string"); return; }
    if (pat && (has_min || has_max)) {  /* ^ATOM{m,n}$: the bounds in the repeat, while small */
      uint64_t largest = 0;
      char *t = pattern_with_length(pat, has_min ? min : 0, max, has_max, &largest);
      if (t && largest <= PAT_INLINE_MAX) {
        uint32_t k = 0;
        while (t[k]) k++;
        narrowed.kind = JV_STR, narrowed.s = t, narrowed.n = k;
        pat = &narrowed, has_min = has_max = false;
      } else aici_free(t);
    }
    uint64_t lo = 0, hi = UINT64_MAX;  /* the language's lengths in characters */
    if (pat) {
      const char *why = 0;
      uint32_t at = ptr_pushs(c, "pattern");
      if (!emit_pattern_capped(&content, pat->s, pat->n, PAT_NO_CAP, 0, &lo, &hi, &why)) UNSUPPORTED(c, "pattern", why);
      ptr_pop(c, at);
    } else if (!emit_format(&content, fmt->s)) {
      uint32_t at = ptr_pushs(c, "format");
      UNSUPPORTED(c, "format", fmt->s);
      ptr_pop(c, at);
    } else {
      length_bounds(content.p, content.n, &lo, &hi);   /* a format's text is ASCII: bytes are characters */
      if (hi == UINT64_MAX) lo = 0;    /* (not told exactly: counted) */
    }
    if (narrowed.s) aici_free((char *)narrowed.s);
    if (c->err) { aici_free(content.p); return; }
    if (has_max && lo > max) {         /* no string fits */
      b->n -= 4, b->p[b->n] = 0;
      sb_puts(b, "[^\\x00-\\xff]");
      aici_free(content.p);
      return;
    }
    if (has_min && lo >= min) has_min = false;
    if (has_max && hi <= max) has_max = false;
  } else {
    if ((!has_max || max <= STR_INLINE_MAX) && min <= STR_INLINE_MIN) {
      emit_chars(b, min, max, !has_max);
      sb_puts(b, "\\x22");
      return;
    }
    sb_puts(&content, "(?:");
    emit_strchar(&content);
    sb_puts(&content, ")*");
  }
  if (has_max && max > STR_MAX) max = STR_MAX;   /* narrower: no string of over 2^27 characters */
  if (has_min && min > STR_MAX) {      /* (bounds the language implies are gone) */
    UNSUPPORTED(c, "minLength", "over 134217728");
  } else if (has_min || has_max) {
    b->n -= 4, b->p[b->n] = 0;         /* the opening quote goes in the machine */
    emit_counted(c, b, pat || fmt ? s : &ANY_MARK, &content, has_min ? min : 0, has_max ? max : CHARS_UNBOUNDED);
  } else {
    sb_putn(b, content.p, content.n);
    sb_puts(b, "\\x22");
  }
  aici_free(content.p);
}

/* ---- numbers --------------------------------------------------------------------------------- */
/* An integer multipleOf between bounds: the multiples themselves, when there are at most 512
 * (written as integers: narrower than a number's 12.0). False: not of that kind. */
static bool emit_multiples(sb_t *b, const jv_t *mv, const bounds_t *bd) {
  if (mv->kind != JV_NUM || !jv_is_int(mv) || mv->num < 1 || mv->num > 1e15 || !bd->has_lo || !bd->has_hi) return false;
  if (bd->lo < -1e15 || bd->hi > 1e15) return false;
  int64_t m = (int64_t)mv->num, lo = (int64_t)bd->lo, hi = (int64_t)bd->hi;
  if ((double)lo < bd->lo || (bd->lo_excl && (double)lo == bd->lo)) lo++;
  if ((double)hi > bd->hi || (bd->hi_excl && (double)hi == bd->hi)) hi--;
  int64_t first = lo % m == 0 ? lo : lo > 0 ? lo + (m - lo % m) : lo - lo % m;
  if (first > hi) { sb_puts(b, "[^\\x00-\\xff]"); return true; }
  if ((hi - first) / m >= 512) return false;
  sb_puts(b, "(?:");
  for (int64_t x = first; x <= hi; x += m) {
    if (x != first) sb_putc(b, '|');
    if (x < 0) sb_puts(b, "\\-");
    sb_uint(b, (uint64_t)(x < 0 ? -x : x));
  }
  sb_putc(b, ')');
  return true;
}

static void emit_num(cx_t *c, sb_t *b, const jv_t *s, bool is_int) {
  bounds_t bd = {0};
  const jv_t *v;
  const char *lo_kw = 0, *hi_kw = 0;   /* the keyword each bound comes from, for errors */
#define LO(v, kw) (bd.has_lo = true, bd.lo = v->num, bd.lo_text = v->s, bd.lo_len = v->n, lo_kw = kw)
#define HI(v, kw) (bd.has_hi = true, bd.hi = v->num, bd.hi_text = v->s, bd.hi_len = v->n, hi_kw = kw)
  if ((v = jv_get(s, "minimum")) && v->kind == JV_NUM) LO(v, "minimum");
  if ((v = jv_get(s, "maximum")) && v->kind == JV_NUM) HI(v, "maximum");
  if ((v = jv_get(s, "exclusiveMinimum"))) {
    if (v->kind == JV_TRUE) bd.lo_excl = bd.has_lo;
    else if (v->kind == JV_NUM && (!bd.has_lo || v->num >= bd.lo)) LO(v, "exclusiveMinimum"), bd.lo_excl = true;
  }
  if ((v = jv_get(s, "exclusiveMaximum"))) {
    if (v->kind == JV_TRUE) bd.hi_excl = bd.has_hi;
    else if (v->kind == JV_NUM && (!bd.has_hi || v->num <= bd.hi)) HI(v, "exclusiveMaximum"), bd.hi_excl = true;
  }
#undef LO
#undef HI
  const char *why = 0;
  if (bd.has_lo && !number_bound_ok(bd.lo_text, bd.lo_len, &why)) { UNSUPPORTED(c, lo_kw, why); return; }
  if (bd.has_hi && !number_bound_ok(bd.hi_text, bd.hi_len, &why)) { UNSUPPORTED(c, hi_kw, why); return; }
  uint32_t frac = 0;
  if ((v = jv_get(s, "multipleOf"))) {
    double m = v->kind == JV_NUM ? v->num : 0, p = 1;
    uint32_t k = 0;
    while (k < 12 && m * p + 1e-9 < 1) p *= 10, k++;
    bool pow10 = m > 0 && (m * p > 1 - 1e-9 && m * p < 1 + 1e-9);
    if (!pow10 || (k == 0 && m != 1)) {
      if (ignored(c, "multipleOf")) relax(c, "multipleOf");
      else if (!emit_multiples(b, v, &bd)) { UNSUPPORTED(c, "multipleOf", "only 1 and powers of 1/10, or up to 512 integer multiples between bounds"); return; }
      else return;
    } else if (k == 0) is_int = true;
    else if (!is_int) frac = k;
  }
  if (!emit_number(b, is_int, &bd, frac, &why)) UNSUPPORTED(c, bd.has_lo ? lo_kw : hi_kw, why);
}

/* ---- arrays ---------------------------------------------------------------------------------- */
static void emit_array(cx_t *c, sb_t *b, const jv_t *s) {
  const char *ws = c->ws;
  uint64_t min = 0, max = 0;
  get_uint(c, s, "minItems", &min);
  bool bounded = get_uint(c, s, "maxItems", &max);
  const jv_t *items = jv_get(s, "items"), *prefix = jv_get(s, "prefixItems"), *rest = items;
  const char *prefix_kw = "prefixItems";
  if (items && items->kind == JV_ARR) {          /* draft 4-7 tuple form */
    prefix = items, prefix_kw = "items";
    rest = jv_get(s, "additionalItems");
  }
  if (!rest) rest = &ANY_MARK;
  bool rest_ok = rest->kind != JV_FALSE;
  uint32_t np = prefix && prefix->kind == JV_ARR ? prefix->n : 0;
  if (bounded && max < min) { sb_puts(b, "[^\\x00-\\xff]"); return; }
  if (min > 10000 || (bounded && max > 10000)) { UNSUPPORTED(c, bounded ? "maxItems" : "minItems", "over 10000"); return; }
  if (!rest_ok && min > np) { sb_puts(b, "[^\\x00-\\xff]"); return; }
  if (!rest_ok && (!bounded || max > np)) max = np, bounded = true;
  sb_puts(b, "\\["), sb_puts(b, ws);
  /* prefix items nest: [p0(,p1(,p2 rest?)?)?]; the first `min` are not optional */
  uint32_t opened = 0, k;
  uint64_t limit = bounded ? max : (uint64_t)-1;
  for (k = 0; k < np && k < limit; k++) {
    bool optional = k >= min;
    if (optional) sb_puts(b, "(?:");
    if (k) sb_puts(b, ws), sb_puts(b, ","), sb_puts(b, ws);
    uint32_t at = ptr_pushs(c, prefix_kw);
    ptr_pushi(c, k);
    emit_value(c, b, &prefix->items[k]);
    ptr_pop(c, at);
    if (c->err) return;
    opened += optional;
  }
  if (rest_ok && k < limit) {
    uint64_t rmin = min > k ? min - k : 0, rmax = bounded ? max - k : 0;
    uint32_t at = rest == items ? ptr_pushs(c, "items") : rest == &ANY_MARK ? c->ptr.n : ptr_pushs(c, "additionalItems");
    sb_t e = {0};
    emit_value(c, &e, rest);
    ptr_pop(c, at);
    if (c->err) return;
    /* rest items: k == 0: (E(,E){rmin-1,rmax-1})?   k > 0: (,E){rmin,rmax} */
    bool first = k == 0;
    if (first) {
      if (!rmin) sb_puts(b, "(?:");
      sb_putn(b, e.p, e.n);
      if (rmin) rmin--;
      if (bounded) rmax--;
    }
    if (!bounded || rmax > 0) {
      sb_puts(b, "(?:"), sb_puts(b, ws), sb_puts(b, ","), sb_puts(b, ws), sb_putn(b, e.p, e.n), sb_puts(b, "){");
      sb_uint(b, rmin), sb_putc(b, ',');
      if (bounded) sb_uint(b, rmax);
      sb_putc(b, '}');
    }
    if (first && !(min > 0)) sb_puts(b, ")?");
    aici_free(e.p);
  }
  for (; opened; opened--) sb_puts(b, ")?");
  sb_puts(b, ws), sb_puts(b, "\\]");
}

/* ---- objects --------------------------------------------------------------------------------- */
typedef struct { uint32_t *kid_cp; uint32_t *kid; uint32_t n_kids, cap; bool terminal; } knode_t;
typedef struct { knode_t *n; uint32_t count, cap; } ktrie_t;

static uint32_t kt_new(ktrie_t *t) {
  if (t->count == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 16;
    t->n = aici_realloc(t->n, t->cap * sizeof(knode_t));
  }
  __builtin_memset(&t->n[t->count], 0, sizeof(knode_t));
  return t->count++;
}

static uint32_t utf8_next(const char *s, uint32_t n, uint32_t *i) {
  uint8_t c = (uint8_t)s[(*i)++];
  if (c < 0x80) return c;
  uint32_t k = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1, cp = c & (0x3f >> k);
  for (uint32_t j = 0; j < k && *i < n; j++) cp = cp << 6 | ((uint8_t)s[(*i)++] & 63);
  return cp;
}

static void kt_add(ktrie_t *t, const char *s, uint32_t n) {
  uint32_t node = 0;
  for (uint32_t i = 0; i < n;) {
    uint32_t cp = utf8_next(s, n, &i), j = 0;
    knode_t *x = &t->n[node];
    while (j < x->n_kids && x->kid_cp[j] != cp) j++;
    if (j == x->n_kids) {
      uint32_t child = kt_new(t);
      x = &t->n[node];
      if (x->n_kids == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 2;
        x->kid_cp = aici_realloc(x->kid_cp, x->cap * 4);
        x->kid = aici_realloc(x->kid, x->cap * 4);
      }
      x->kid_cp[j] = cp, x->kid[j] = child, x->n_kids++;
    }
    node = t->n[node].kid[j];
  }
  t->n[node].terminal = true;
}

/* Key texts that are none of the trie's keys: a proper prefix of a key that is no key itself
 * (E), or a key path, then a character that leaves the trie (raw, or its canonical escape: an
 * escape of a listed character would spell a listed key), then anything (D, then one shared
 * STRCHAR* loop, so that every diverged key text is one DFA state). */
static void emit_early_ends(sb_t *b, ktrie_t *t, uint32_t node) {
  knode_t *x = &t->n[node];
  sb_puts(b, "(?:");
  bool first = true;
  if (!x->terminal) first = false;     /* the empty alternative: end here */
  for (uint32_t j = 0; j < x->n_kids; j++) {
    if (!first) sb_putc(b, '|');
    first = false;
    cp_set_t one = {0};
    aici_cps_add(&one, x->kid_cp[j], x->kid_cp[j]);
    emit_cp_set(b, &one);
    aici_free(one.r);
    emit_early_ends(b, t, t->n[node].kid[j]);
  }
  if (first) sb_puts(b, "[^\\x00-\\xff]");
  sb_putc(b, ')');
}

static void emit_divergences(sb_t *b, ktrie_t *t, uint32_t node) {
  knode_t *x = &t->n[node];
  cp_set_t other = {0}, low = {0};     /* not children: above \ (raw), and up to \ (escapes too) */
  for (uint32_t j = 0; j < x->n_kids; j++) aici_cps_add(&other, x->kid_cp[j], x->kid_cp[j]);
  aici_cps_add(&other, 0, 0x5c);
  aici_cps_negate(&other);
  for (uint32_t c = 0; c <= 0x5c; c++) {
    bool kid = false;
    for (uint32_t j = 0; j < x->n_kids; j++) kid |= x->kid_cp[j] == c;
    if (!kid) aici_cps_add(&low, c, c);
  }
  sb_puts(b, "(?:");
  emit_cp_set(b, &other);
  if (low.n) sb_putc(b, '|'), emit_cp_set(b, &low);
  aici_free(low.r), aici_free(other.r);
  for (uint32_t j = 0; j < x->n_kids; j++) {
    sb_putc(b, '|');
    cp_set_t one = {0};
    aici_cps_add(&one, x->kid_cp[j], x->kid_cp[j]);
    emit_cp_set(b, &one);
    aici_free(one.r);
    emit_divergences(b, t, t->n[node].kid[j]);
  }
  sb_putc(b, ')');
}

static void emit_not_keys(sb_t *b, ktrie_t *t, uint32_t node) {
  sb_puts(b, "(?:");
  emit_early_ends(b, t, node);
  sb_putc(b, '|');
  emit_divergences(b, t, node);
  emit_strchar(b);
  sb_puts(b, "*)");
}

static bool is_required(const jv_t *req, const jv_t *key) {
  if (!req || req->kind != JV_ARR) return false;
  for (uint32_t i = 0; i < req->n; i++)
    if (req->items[i].kind == JV_STR && req->items[i].n == key->n && !__builtin_memcmp(req->items[i].s, key->s, key->n))
      return true;
  return false;
}

typedef struct { sb_t text; bool required; } prop_t;

/* Is the JSON text of a key in the language of a string-content regex? */
static bool key_matches(const char *re_text, uint32_t re_len, const jv_t *key) {
  aici_regex_t *re = aici_regex_compile(re_text, re_len, 0);
  if (!re) return true;                /* cannot tell: the caller refuses */
  sb_t t = {0};
  jv_write_str(&t, key->s, key->n);
  uint32_t st = aici_regex_advance(re, aici_regex_start(re), (const uint8_t *)t.p + 1, t.n - 2);
  aici_free(t.p);
  return st && aici_regex_accepting(re, st);
}

/* No string in both languages: a breadth-first walk over pairs of DFA states. */
static bool regex_disjoint(const char *a_text, uint32_t a_len, const char *b_text, uint32_t b_len) {
  aici_regex_t *a = aici_regex_compile(a_text, a_len, 0), *b = aici_regex_compile(b_text, b_len, 0);
  if (!a || !b) return false;
  enum { LIMIT = 4096 };
  uint32_t *qa = aici_malloc(LIMIT * 4), *qb = aici_malloc(LIMIT * 4), n = 1;
  qa[0] = aici_regex_start(a), qb[0] = aici_regex_start(b);
  bool disjoint = true;
  for (uint32_t i = 0; i < n && disjoint; i++) {
    if (aici_regex_accepting(a, qa[i]) && aici_regex_accepting(b, qb[i])) { disjoint = false; break; }
    for (uint32_t byte = 0; byte < 256 && disjoint; byte++) {
      uint32_t x = aici_regex_step(a, qa[i], (uint8_t)byte), y = x ? aici_regex_step(b, qb[i], (uint8_t)byte) : 0;
      if (!x || !y) continue;
      uint32_t j = 0;
      while (j < n && (qa[j] != x || qb[j] != y)) j++;
      if (j < n) continue;
      if (n == LIMIT) { disjoint = false; break; }   /* too big to tell */
      qa[n] = x, qb[n++] = y;
    }
  }
  aici_free(qa), aici_free(qb);
  return disjoint;
}

/* patternProperties' regexes over key contents, one a pattern (NULL with c->err: a pattern the
 * controller cannot do, or two that may match one key: refused). */
static sb_t *pattern_texts(cx_t *c, const jv_t *pp) {
  uint32_t at = ptr_pushs(c, "patternProperties");
  sb_t *pats = aici_calloc(pp->n + 1, sizeof(sb_t));
  for (uint32_t i = 0; i < pp->n && !c->err; i++) {
    uint32_t at2 = ptr_push(c, pp->keys[i].s, pp->keys[i].n);
    const char *why = 0;
    if (!emit_pattern(&pats[i], pp->keys[i].s, pp->keys[i].n, &why)) UNSUPPORTED(c, "patternProperties", why);
    for (uint32_t j = 0; !c->err && j < i; j++)
      if (!regex_disjoint(pats[i].p, pats[i].n, pats[j].p, pats[j].n)) UNSUPPORTED(c, "patternProperties", "patterns that may match one key");
    ptr_pop(c, at2);
  }
  ptr_pop(c, at);
  if (c->err) {
    for (uint32_t i = 0; i < pp->n; i++) aici_free(pats[i].p);
    aici_free(pats);
    return 0;
  }
  return pats;
}

/* `val` (NULL: none yet) with the schema of every pattern the key matches; NULL if none does. */
static const jv_t *with_patterns(const jv_t *val, const jv_t *key, const jv_t *pp, const sb_t *pats) {
  for (uint32_t i = 0; pp && i < pp->n; i++)
    if (key_matches(pats[i].p, pats[i].n, key)) val = val ? all_of2(val, &pp->items[i]) : &pp->items[i];
  return val;
}

#define KEYLANG_STATES 1024u           /* product states a key language may have */

/* The key contents of a key language (keylang.c) as machines; false when it is too large. The
 * start is inline when it is the plain STRCHAR*. */
static bool emit_keylang(cx_t *c, sb_t *b, const sb_t *pats, uint32_t n_pats, int32_t target, const sb_t *keys) {
  const char *texts[64];
  uint32_t lens[64];
  for (uint32_t i = 0; i < n_pats && i < 64; i++) texts[i] = pats[i].p ? pats[i].p : "", lens[i] = pats[i].n;
  keylang_t *L = keylang_new(texts, lens, n_pats, target, keys->p, keys->n, KEYLANG_STATES);
  if (!L || c->n_keys + keylang_machines(L) > MAX_MACHINES) { keylang_free(L); return false; }
  if (keylang_empty(L)) {
    sb_puts(b, "[^\\x00-\\xff]");
  } else if (keylang_start_is_free(L)) {
    keylang_start_text(L, 0, b);
  } else {
    uint32_t base = c->n_keys;
    const jv_t *marker = jv_new(JV_NULL);   /* fresh: these machines are found by no other schema */
    for (uint32_t i = 0; i < keylang_machines(L) && !c->err; i++) {
      key_arg = i;
      uint32_t m = machine_for(c, marker, MK_KEYLANG, 0, 0);
      key_arg = 0;
      sb_t t = {0};
      keylang_text(L, i, base, &t);
      if (!c->err) set_text(c, m, t.p, t.n);
      aici_free(t.p);
    }
    keylang_start_text(L, base, b);
  }
  keylang_free(L);
  return true;
}

/* patternProperties beside the listed keys (`keys`: their contents as one alternation): an entry
 * for each pattern, keys in its language but none of the listed ones, with its schema; and, where
 * additionalProperties allows them (`addl` not false), one for the keys that match no pattern,
 * with its schema. Into `add` as one alternation (empty: no entry at all). */
static void emit_pattern_props(cx_t *c, sb_t *add, const jv_t *pp, const sb_t *pats, const sb_t *keys,
                               const jv_t *addl) {
  uint32_t at = ptr_pushs(c, "patternProperties");
  for (uint32_t i = 0; i <= pp->n && !c->err; i++) {
    bool rest = i == pp->n;            /* the keys that match no pattern */
    if (rest && addl && addl->kind == JV_FALSE) break;
    if (!rest && pp->items[i].kind == JV_FALSE) continue;
    uint32_t at2;
    if (rest) ptr_pop(c, at), at2 = ptr_pushs(c, "additionalProperties");
    else at2 = ptr_push(c, pp->keys[i].s, pp->keys[i].n);
    sb_t k = {0};
    sb_puts(&k, "\\x22");
    /* a pattern that matches no listed key: its own text; else the product (keylang.c) */
    bool listed_match = !rest && keys->n && !regex_disjoint(pats[i].p, pats[i].n, keys->p, keys->n), ok = true;
    if (!rest && !listed_match) sb_putn(&k, pats[i].p, pats[i].n);
    else ok = emit_keylang(c, &k, pats, pp->n, rest ? -1 : (int32_t)i, keys);
    sb_puts(&k, "\\x22");
    if (!ok && !rest) UNSUPPORTED(c, "patternProperties", "a pattern that matches listed keys, too large to take them out");
    if (ok && !c->err) {               /* !ok and rest: keys matching no pattern not offered (narrower) */
      if (add->n) sb_putc(add, '|');
      sb_putn(add, k.p, k.n);
      sb_puts(add, c->ws), sb_putc(add, ':'), sb_puts(add, c->ws);
      emit_value(c, add, rest ? (addl ? addl : &ANY_MARK) : &pp->items[i]);
    }
    aici_free(k.p);
    ptr_pop(c, at2);
  }
  ptr_pop(c, at);
  if (add->n) {                        /* one alternation, as one additional-property entry */
    sb_t t = {0};
    sb_puts(&t, "(?:"), sb_putn(&t, add->p, add->n), sb_putc(&t, ')');
    aici_free(add->p);
    *add = t;
  }
}

/* The members of an object, keys in schema order: entries p[0..n) (`"key":value` each), then
 * additional ones (`add`: one entry's regex; NULL: none). Linear in the entries whatever their
 * mix of optional and required ones (no expansion per leading optional key): with r the first
 * required entry, the optional ones before it are the left-nested chain
 *   X_0 = P_0,  X_i = (?:X_{i-1}(?:,P_i)?|P_i)   (every nonempty subsequence of P_0..P_i)
 * (each entry's text twice), then (?:X_{r-1},)?P_r, then (?:,P_j)? or ,P_j for the others, then
 * (?:,A)*. With no required entry: (?:X_{n-1}(?:,A)*|A(?:,A)*), optional unless `nonempty`. */
static void emit_members(sb_t *b, const prop_t *p, uint32_t n, const sb_t *add, bool nonempty, const char *ws) {
#define SEP() (sb_puts(b, ws), sb_putc(b, ','), sb_puts(b, ws))
#define ADDS() (add ? (sb_puts(b, "(?:"), SEP(), sb_putn(b, add->p, add->n), sb_puts(b, ")*")) : (void)0)
  uint32_t r = 0;
  while (r < n && !p[r].required) r++;
  if (!n) {
    if (add) sb_puts(b, "(?:"), sb_putn(b, add->p, add->n), ADDS(), sb_puts(b, nonempty ? ")" : ")?");
    else if (nonempty) sb_puts(b, "[^\\x00-\\xff]");
    return;
  }
  if (r) sb_puts(b, "(?:");            /* r < n: (?:X_{r-1},)?; r == n: the alternatives */
  for (uint32_t i = 1; i < r; i++) sb_puts(b, "(?:");
  if (r) sb_putn(b, p[0].text.p, p[0].text.n);
  for (uint32_t i = 1; i < r; i++) {
    sb_puts(b, "(?:"), SEP(), sb_putn(b, p[i].text.p, p[i].text.n);
    sb_puts(b, ")?|"), sb_putn(b, p[i].text.p, p[i].text.n), sb_putc(b, ')');
  }
  if (r < n) {
    if (r) SEP(), sb_puts(b, ")?");
    sb_putn(b, p[r].text.p, p[r].text.n);
    for (uint32_t j = r + 1; j < n; j++) {
      if (!p[j].required) sb_puts(b, "(?:");
      SEP(), sb_putn(b, p[j].text.p, p[j].text.n);
      if (!p[j].required) sb_puts(b, ")?");
    }
    ADDS();
  } else {
    ADDS();
    if (add) sb_putc(b, '|'), sb_putn(b, add->p, add->n), ADDS();
    sb_puts(b, nonempty ? ")" : ")?");
  }
#undef ADDS
#undef SEP
}

/* The members in any order (anyorder.c): a call to the dynamic machine of "nothing written". */
static void emit_any_order(cx_t *c, sb_t *b, const prop_t *p, uint32_t n, const sb_t *add, bool nonempty) {
  if (!c->out->dyn) c->out->dyn = dyn_new(), c->out->dyn_write = dyn_text;
  sb_t *entries = aici_calloc(n + 1, sizeof(sb_t));
  bool *req = aici_calloc(n + 1, 1);
  for (uint32_t i = 0; i < n; i++) entries[i] = p[i].text, req[i] = p[i].required;
  uint32_t obj = dyn_object(c->out->dyn, n, entries, req, add, nonempty, c->ws);
  aici_free(entries), aici_free(req);
  key_arg = obj;
  uint32_t m = machine_for(c, &ANY_MARK, MK_ANY_ORDER, 0, 0);
  key_arg = 0;
  if (c->err) return;
  c->pending[m] = 0;                   /* no text: written when first entered */
  dyn_bind_start(c->out->dyn, obj, m);
  emit_call(c, b, m);
}

static void emit_object(cx_t *c, sb_t *b, const jv_t *s) {
  const char *ws = c->ws;
  const jv_t *props = jv_get(s, "properties"), *req = jv_get(s, "required"), *addl = jv_get(s, "additionalProperties");
  if (props && props->kind != JV_OBJ) props = 0;
  const jv_t *pp = jv_get(s, "patternProperties"), *every = 0;
  if (pp && pp->kind == JV_OBJ && pp->n == 1) {
    /* one pattern that every key matches (".*"): its schema applies to the listed properties
     * too, and takes the place of additionalProperties (which then applies to no key) */
    static const char *const ALL_KEYS[] = {"", ".*", "^.*", ".*$", 0};
    if (in_list(&pp->keys[0], ALL_KEYS)) every = &pp->items[0], addl = every, pp = 0;
  }
  if (pp && (pp->kind != JV_OBJ || !pp->n)) pp = 0;
  sb_t *pats = pp ? pattern_texts(c, pp) : 0;
  if (c->err) return;
  uint32_t np = props ? props->n : 0, n = 0, n_req = 0;
  prop_t *p = aici_calloc(np + 1, sizeof(prop_t));
  /* required keys that properties does not list: extra entries whose values follow the patterns
   * they match, else additionalProperties, after the listed ones */
  jv_t *extra = jv_new(JV_OBJ);
  if (req && req->kind == JV_ARR)
    for (uint32_t i = 0; i < req->n; i++) {
      const jv_t *k = &req->items[i];
      bool listed = false;
      for (uint32_t j = 0; props && j < props->n; j++) listed |= props->keys[j].n == k->n && !__builtin_memcmp(props->keys[j].s, k->s, k->n);
      for (uint32_t j = 0; j < extra->n; j++) listed |= extra->keys[j].n == k->n && !__builtin_memcmp(extra->keys[j].s, k->s, k->n);
      if (k->kind != JV_STR || listed) continue;
      const jv_t *v = with_patterns(0, k, pp, pats);
      jv_obj_put(extra, k->s, k->n, v ? v : addl ? addl : &ANY_MARK);
    }
  uint32_t ne = extra->n;
  if (np + ne > PROPS_MAX) {           /* a checked limit: past it the machines outgrow guest memory */
    char d[96];
    uint32_t k = 0, v = np + ne;
    char t[12];
    int m = 0;
    do t[m++] = (char)('0' + v % 10), v /= 10; while (v);
    while (m) d[k++] = t[--m];
    __builtin_memcpy(d + k, " properties; at most 1024 an object", 36);
    fail(c, "too large: ", "properties", d);
    aici_free(p);
    return;
  }
  p = aici_realloc(p, (np + ne + 1) * sizeof(prop_t));
  __builtin_memset(p, 0, (np + ne + 1) * sizeof(prop_t));
  for (uint32_t i = 0; i < np + ne && !c->err; i++) {
    const jv_t *key = i < np ? &props->keys[i] : &extra->keys[i - np];
    const jv_t *val = i < np ? &props->items[i] : &extra->items[i - np];
    if (every && i < np) val = all_of2(val, every);
    if (i < np) val = with_patterns(val, key, pp, pats);   /* a listed key the patterns match: both */
    bool r = is_required(req, key);
    if (val->kind == JV_FALSE) {
      if (r) { sb_puts(b, "[^\\x00-\\xff]"); aici_free(p); return; }
      continue;
    }
    sb_t *t = &p[n].text;
    sb_t enc = {0};
    jv_write_str(&enc, key->s, key->n);
    sb_lit(t, enc.p, enc.n);
    aici_free(enc.p);
    sb_puts(t, ws), sb_putc(t, ':'), sb_puts(t, ws);
    uint32_t at = i < np ? ptr_pushs(c, "properties") : ptr_pushs(c, "required");
    ptr_push(c, key->s, key->n);
    /* each text is written twice (schema order), or once a key set (any_order) */
    emit_value_within(c, t, val, c->o->any_order ? 128 : np + ne > 32 ? 256 : OUTLINE_BYTES);
    ptr_pop(c, at);
    p[n].required = r, n_req += r;
    n++;
  }
  /* additional properties: keys that are none of the listed ones */
  sb_t add = {0};
  bool has_add = !addl || addl->kind != JV_FALSE;
  if (pp && !c->err) {
    sb_t keys = {0};                   /* the listed keys' contents, one alternation */
    for (uint32_t i = 0; i < np + ne; i++) {
      const jv_t *key = i < np ? &props->keys[i] : &extra->keys[i - np];
      sb_t enc = {0};
      jv_write_str(&enc, key->s, key->n);
      sb_puts(&keys, i ? "|" : "(?:"), sb_lit(&keys, enc.p + 1, enc.n - 2);
      aici_free(enc.p);
    }
    if (keys.n) sb_putc(&keys, ')');
    emit_pattern_props(c, &add, pp, pats, &keys, addl);
    aici_free(keys.p);
    has_add = add.n > 0;
  } else if (has_add && !c->err) {
    ktrie_t kt = {0};
    kt_new(&kt);
    for (uint32_t i = 0; i < np; i++) kt_add(&kt, props->keys[i].s, props->keys[i].n);
    for (uint32_t i = 0; i < ne; i++) kt_add(&kt, extra->keys[i].s, extra->keys[i].n);
    sb_puts(&add, "\\x22");
    emit_not_keys(&add, &kt, 0);
    sb_puts(&add, "\\x22"), sb_puts(&add, ws), sb_putc(&add, ':'), sb_puts(&add, ws);
    uint32_t at = every ? ptr_pushs(c, "patternProperties") : addl ? ptr_pushs(c, "additionalProperties") : c->ptr.n;
    emit_value(c, &add, addl ? addl : &ANY_MARK);
    ptr_pop(c, at);
    for (uint32_t i = 0; i < kt.count; i++) aici_free(kt.n[i].kid_cp), aici_free(kt.n[i].kid);
    aici_free(kt.n);
  }
  uint64_t minp = 0, maxp = 0;
  if (get_uint(c, s, "minProperties", &minp) && minp > n_req && minp > 1) UNSUPPORTED(c, "minProperties", "over 1, and more than the required properties");
  bool nonempty = minp >= 1;           /* minProperties 1: no empty object */
  if (get_uint(c, s, "maxProperties", &maxp) && (has_add || maxp < n)) UNSUPPORTED(c, "maxProperties", "fewer than the properties allowed");
  if (c->err) goto done;
  sb_puts(b, "\\{"), sb_puts(b, ws);
  if (c->o->any_order) emit_any_order(c, b, p, n, has_add ? &add : 0, nonempty);
  else emit_members(b, p, n, has_add ? &add : 0, nonempty, ws);
  sb_puts(b, ws), sb_puts(b, "\\}");
done:
  for (uint32_t i = 0; pats && i < pp->n; i++) aici_free(pats[i].p);
  aici_free(pats);
  for (uint32_t i = 0; i < n; i++) aici_free(p[i].text.p);
  aici_free(p), aici_free(add.p);
}

/* ---- free-form values: one recursive machine ------------------------------------------------- */
static void emit_any_value(cx_t *c, sb_t *b) {
  uint32_t m = machine_for(c, &ANY_MARK, 1, 0, 0);
  if (c->err) return;
  if (c->pending[m]) {
    sb_t t = {0};
    const char *ws = c->ws;
    sb_t call = {0};
    emit_call(c, &call, m);
    sb_puts(&t, "null|true|false|");
    bounds_t none = {0};
    const char *why;
    emit_number(&t, false, &none, 0, &why);
    sb_puts(&t, "|\\x22");
    emit_chars(&t, 0, 0, true);
    sb_puts(&t, "\\x22|\\["), sb_puts(&t, ws), sb_puts(&t, "(?:"), sb_putn(&t, call.p, call.n);
    sb_puts(&t, "(?:"), sb_puts(&t, ws), sb_putc(&t, ','), sb_puts(&t, ws), sb_putn(&t, call.p, call.n);
    sb_puts(&t, ")*)?"), sb_puts(&t, ws), sb_puts(&t, "\\]|\\{"), sb_puts(&t, ws);
    sb_t kv = {0};
    sb_puts(&kv, "\\x22"), emit_chars(&kv, 0, 0, true), sb_puts(&kv, "\\x22"), sb_puts(&kv, ws), sb_putc(&kv, ':');
    sb_puts(&kv, ws), sb_putn(&kv, call.p, call.n);
    sb_puts(&t, "(?:"), sb_putn(&t, kv.p, kv.n), sb_puts(&t, "(?:"), sb_puts(&t, ws), sb_putc(&t, ','), sb_puts(&t, ws);
    sb_putn(&t, kv.p, kv.n), sb_puts(&t, ")*)?"), sb_puts(&t, ws), sb_puts(&t, "\\}");
    set_text(c, m, t.p, t.n);
    aici_free(t.p), aici_free(kv.p), aici_free(call.p);
  }
  emit_call(c, b, m);
}

/* ---- allOf: merged into one schema where the keywords allow ---------------------------------- */
static jv_t *obj_without(const jv_t *s, const char *const *drop) {
  jv_t *o = jv_new(JV_OBJ);
  for (uint32_t i = 0; i < s->n; i++)
    if (!in_list(&s->keys[i], drop)) jv_obj_put(o, s->keys[i].s, s->keys[i].n, &s->items[i]);
  return o;
}

static jv_t *all_of2(const jv_t *a, const jv_t *b) {
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
    for (uint32_t i = 0; i < s->n; i++) siblings |= !jv_str_is(&s->keys[i], "$ref") && is_constraint_key(&s->keys[i]);
    const jv_t *t = resolve(c, r);
    if (!t) return 0;
    if (siblings) {
      static const char *const drop[] = {"$ref", 0};
      return all_of2(t, obj_without(s, drop));
    }
    s = t;
  }
  if (s && s->kind == JV_OBJ && jv_get(s, "$ref")) { UNSUPPORTED(c, "$ref", "a chain of 32 references"); return 0; }
  return s;
}

static uint32_t type_bits(const jv_t *t) {     /* null bool object array string integer number */
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

static jv_t *types_value(uint32_t bits) {
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
    if (!vb || jv_equal(va, vb) || in_list(k, ANNOTATIONS) || !is_constraint_key(k)) {
      if (!jv_str_is(k, "properties")) { jv_obj_put(o, k->s, k->n, va); continue; }
    }
    if (jv_str_is(k, "type")) {
      uint32_t bits = type_bits(va) & type_bits(vb);
      jv_obj_put(o, k->s, k->n, types_value(bits));
    } else if (in_list(k, MAXES) || in_list(k, MINS)) {
      if (va->kind == JV_NUM && vb->kind == JV_NUM) {
        bool take_a = in_list(k, MAXES) ? va->num >= vb->num : va->num <= vb->num;
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
        jv_obj_put(r, pa->keys[x].s, pa->keys[x].n, other ? all_of2(&pa->items[x], other) : &pa->items[x]);
      }
      for (uint32_t y = 0; pb && y < pb->n; y++) {
        bool seen = false;
        for (uint32_t x = 0; pa && x < pa->n; x++)
          seen |= pb->keys[y].n == pa->keys[x].n && !__builtin_memcmp(pb->keys[y].s, pa->keys[x].s, pb->keys[y].n);
        if (!seen) jv_obj_put(r, pb->keys[y].s, pb->keys[y].n, adda ? all_of2(&pb->items[y], adda) : &pb->items[y]);
      }
      jv_obj_put(o, k->s, k->n, r);
    } else if (jv_str_is(k, "additionalProperties") || (jv_str_is(k, "items") && va->kind != JV_ARR && vb->kind != JV_ARR) ||
               jv_str_is(k, "additionalItems")) {
      jv_obj_put(o, k->s, k->n, all_of2(va, vb));
    } else if (jv_str_is(k, "anyOf") || jv_str_is(k, "oneOf")) {
      if (va->kind != JV_ARR || vb->kind != JV_ARR || va->n * vb->n > MAX_ALTS) { UNSUPPORTED(c, "allOf", "of two large anyOf/oneOf"); return 0; }
      if (jv_str_is(k, "oneOf")) { UNSUPPORTED(c, "allOf", "of two oneOf"); return 0; }
      jv_t *r = jv_new(JV_ARR);
      r->items = aici_malloc((va->n * vb->n + 1) * sizeof(jv_t));
      for (uint32_t x = 0; x < va->n; x++)
        for (uint32_t y = 0; y < vb->n; y++) r->items[r->n++] = *all_of2(&va->items[x], &vb->items[y]);
      jv_obj_put(o, k->s, k->n, r);
    } else if (in_list(k, SAME) || jv_str_is(k, "items") || jv_str_is(k, "prefixItems")) {
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
          jv_obj_put(r, b->items[j].keys[y].s, b->items[j].keys[y].n, all_of2(&b->items[j].items[y], adda));
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

static const jv_t *flatten(cx_t *c, const jv_t *s) {
  if (c->err) return 0;
  if (!c->fdepth) c->fptr0 = c->ptr.n;
  if (c->fdepth >= FLATTEN_DEPTH_MAX) {
    /* named where the nesting starts: the pointer cut two segments past the outermost allOf */
    uint32_t cut = c->fptr0, seg = 0;
    while (cut < c->ptr.n && seg < 3) seg += c->ptr.p[cut] == '/', cut += seg < 3;
    if (c->ptr.p && cut < c->ptr.n) ptr_pop(c, cut);
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
  if (!check_values(c, s)) return 0;
  static const char *const drop[] = {"allOf", 0};
  const jv_t *acc = obj_without(s, drop);
  for (uint32_t i = 0; i < all->n && acc; i++) {
    uint32_t at = ptr_pushs(c, "allOf");
    ptr_pushi(c, i);
    const jv_t *part = flatten(c, &all->items[i]);
    if (part && part->kind == JV_OBJ && jv_get(part, "not")) part = flatten(c, without_not(c, part));
    if (part && !c->err && !check_keywords(c, part)) part = 0;
    ptr_pop(c, at);
    if (!part) return 0;
    if (part->kind == JV_FALSE) return &FALSE_SCHEMA;
    if (part->kind != JV_OBJ) continue;  /* true */
    acc = merge2(c, acc, part);
    if (acc && jv_get(acc, "$ref")) acc = flatten(c, acc);
  }
  return acc;
}

/* ---- oneOf: only when its branches cannot both match ------------------------------------------- */
static uint32_t kinds_of_at(cx_t *c, const jv_t *s, uint32_t depth);
static uint32_t kinds_of(cx_t *c, const jv_t *s) { return kinds_of_at(c, s, 0); }

/* The kinds of value `s` may admit (a superset: deeper than SCAN_DEPTH_MAX, every kind). */
static uint32_t kinds_of_at(cx_t *c, const jv_t *s, uint32_t depth) {
  if (depth > SCAN_DEPTH_MAX) return 127;
  s = deref(c, s);
  if (!s || s->kind == JV_FALSE) return 0;
  if (s->kind != JV_OBJ) return 127;
  uint32_t bits = 127;
  const jv_t *t = jv_get(s, "type"), *e = jv_get(s, "enum"), *k = jv_get(s, "const");
  if (t) bits = type_bits(t);
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
static const jv_t *value_schema(cx_t *c, const jv_t *s, const jv_t *key) {
  const jv_t *p = jv_get(s, "properties"), *pp = jv_get(s, "patternProperties");
  for (uint32_t i = 0; p && p->kind == JV_OBJ && i < p->n; i++)
    if (p->keys[i].n == key->n && !__builtin_memcmp(p->keys[i].s, key->s, key->n)) return &p->items[i];
  for (uint32_t i = 0; pp && pp->kind == JV_OBJ && i < pp->n; i++) {
    sb_t t = {0};
    const char *why = 0;
    aici_regex_t *re = emit_pattern(&t, pp->keys[i].s, pp->keys[i].n, &why) ? aici_regex_compile(t.p, t.n, 0) : 0;
    aici_free(t.p);
    if (!re) return 0;                 /* cannot tell whether it matches: anything */
    sb_t k = {0};
    jv_write_str(&k, key->s, key->n);
    uint32_t st = aici_regex_advance(re, aici_regex_start(re), (const uint8_t *)k.p + 1, k.n - 2);
    aici_free(k.p);
    if (st && aici_regex_accepting(re, st)) return &pp->items[i];
  }
  return jv_get(s, "additionalProperties");
}

/* No two values satisfy both (their kinds, or their literals, are disjoint). */
static bool values_disjoint(cx_t *c, const jv_t *a, const jv_t *b) {
  return !(kinds_of(c, a) & kinds_of(c, b)) || literals_disjoint(c, a, b);
}

static bool keys_disjoint(cx_t *c, const jv_t *a, const jv_t *b, const jv_t *req) {
  for (uint32_t i = 0; req && req->kind == JV_ARR && i < req->n; i++) {
    const jv_t *k = &req->items[i];
    if (k->kind != JV_STR) continue;
    const jv_t *va = value_schema(c, a, k), *vb = value_schema(c, b, k);
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
    if (!is_constraint_key(k) || jv_str_is(k, "type")) continue;
    bool other = (in_list(k, OBJ) && kind != 4) || (in_list(k, ARR) && kind != 8) || (in_list(k, STR) && kind != 16) ||
                 (in_list(k, NUM) && !(kind & 96));
    if (!other) return false;
  }
  return true;
}

/* oneOf, exactly: for each kind of value two branches both admit, either no value of that kind
 * satisfies both (disjoint literals; for objects, a required key's literals or a required key
 * the other forbids), or both admit every value of that kind, so that no value of it matches
 * exactly one branch: the kind is then taken out of every branch (*excluded gets its bit).
 * False: branches that may overlap otherwise. */
static bool one_of_exact(cx_t *c, const jv_t *alts, const jv_t *rest, uint32_t *excluded) {
  *excluded = 0;
  uint32_t within = kinds_of(c, rest);  /* the siblings' kinds: no other value matters */
  const jv_t *parent_req = jv_get(rest, "required");
  for (uint32_t i = 0; i < alts->n; i++)
    for (uint32_t j = i + 1; j < alts->n; j++) {
      const jv_t *a = &alts->items[i], *b = &alts->items[j];
      uint32_t both = kinds_of(c, a) & kinds_of(c, b) & within;
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

/* ---- complements: `not`, and oneOf made exact ------------------------------------------------
 * negate(s) is the complement of s as a list of schemas whose union it is (an empty list: s
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
  sb_t t = {0};
  sb_uint(&t, x);
  jv_t *v = jv_new(JV_NUM);
  v->s = t.p, v->n = t.n, v->num = (double)x;
  return v;
}

static jv_t *typed(uint32_t bits) {    /* {"type": bits} */
  jv_t *o = jv_new(JV_OBJ);
  jv_obj_put(o, "type", 4, types_value(bits));
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

static void cp_escape(sb_t *b, uint32_t cp) {   /* an ECMA escape of one code point */
  static const char hx[] = "0123456789abcdef";
  if (cp > 0xffff) {
    sb_puts(b, "\\u{");
    char t[8];
    int k = 0;
    do t[k++] = hx[cp & 15], cp >>= 4; while (cp);
    while (k) sb_putc(b, t[--k]);
    sb_putc(b, '}');
    return;
  }
  char e[6] = {'\\', 'u', hx[cp >> 12], hx[(cp >> 8) & 15], hx[(cp >> 4) & 15], hx[cp & 15]};
  sb_putn(b, e, 6);
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
static void words_complement(sb_t *b, cps_t *w, uint32_t n, uint32_t d) {
  bool terminal = false;
  uint32_t *kids = aici_malloc((n + 1) * 4), nk = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (w[i].n == d) { terminal = true; continue; }
    bool seen = false;
    for (uint32_t k = 0; k < nk && !seen; k++) seen = kids[k] == w[i].cp[d];
    if (!seen) kids[nk++] = w[i].cp[d];
  }
  sb_puts(b, "(?:");
  if (!nk) sb_puts(b, "[^]+");
  else {
    sb_puts(b, "[^");
    for (uint32_t k = 0; k < nk; k++) cp_escape(b, kids[k]);
    sb_puts(b, "][^]*");
  }
  cps_t *sub = aici_malloc((n + 1) * sizeof(cps_t));
  for (uint32_t k = 0; k < nk; k++) {
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
      if (w[i].n > d && w[i].cp[d] == kids[k]) sub[m++] = w[i];
    sb_putc(b, '|');
    cp_escape(b, kids[k]);
    words_complement(b, sub, m, d + 1);
  }
  sb_putc(b, ')');
  if (!terminal) sb_putc(b, '?');      /* this prefix itself is no word */
  aici_free(sub), aici_free(kids);
}

static jv_t *negate(cx_t *c, const jv_t *s, uint32_t depth, uint32_t U);

/* A string schema with its NOT_IN written as a pattern (the trie of the words, complemented). */
static const jv_t *strings_of(cx_t *c, const jv_t *s) {
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
  sb_t p = {0};
  sb_putc(&p, '^');
  words_complement(&p, words, n, 0);
  sb_putc(&p, '$');
  for (uint32_t i = 0; i < n; i++) aici_free(words[i].cp);
  aici_free(words);
  static const char *const drop[] = {NOT_IN, 0};
  jv_t *o = obj_without(s, drop);
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

static jv_t *negate(cx_t *c, const jv_t *s, uint32_t depth, uint32_t U) {
  static const char *const STR_KW[] = {"pattern", "format", NOT_IN, 0};
  static const char *const NUM_KW[] = {"multipleOf", 0};
  static const char *const ARR_KW[] = {"items", "prefixItems", "additionalItems", "contains", "minContains",
                                       "maxContains", "unevaluatedItems", 0};
  static const char *const OBJ_KW[] = {"patternProperties", "minProperties", "maxProperties", "dependencies",
                                       "dependentRequired", "dependentSchemas", "propertyNames",
                                       "unevaluatedProperties", 0};
  if (depth > 8 || c->err) return 0;
  s = flatten(c, s);
  if (!s || c->err) return 0;
  jv_t *out = jv_new(JV_ARR);
  if (s->kind == JV_TRUE) return out;
  if (s->kind == JV_FALSE) { neg_push(out, &ANY_MARK); return out; }
  if (s->kind != JV_OBJ) return 0;
  const jv_t *t = jv_get(s, "type"), *k = jv_get(s, "const"), *e = jv_get(s, "enum");
  uint32_t T = t ? type_bits(t) : 127;
  if (t && !T) return 0;
  bool literals = k || (e && e->kind == JV_ARR);
  if ((T & 32) && !(T & 64) && (U & 64) && !literals) return 0;   /* "numbers that are no integers" */
  uint32_t whole = U & ~T & ~(T & 32 ? 96u : 0u);     /* kinds all of whose values are in it */
  T &= U;
  uint64_t x;
  for (uint32_t i = 0; i < s->n; i++) {
    const jv_t *key = &s->keys[i], *v = &s->items[i];
    if (!is_constraint_key(key) || jv_str_is(key, "type") || jv_str_is(key, "const") || jv_str_is(key, "enum")) continue;
    bool ok = true;
    if (jv_str_is(key, "not")) {
      ok = neg_push(out, T == 127 ? v : all_of2(typed(T), v));
    } else if (jv_str_is(key, "required")) {
      for (uint32_t r = 0; ok && (T & 4) && v->kind == JV_ARR && r < v->n; r++) {
        if (v->items[r].kind != JV_STR) continue;
        jv_t *p = jv_new(JV_OBJ);
        jv_obj_put(p, v->items[r].s, v->items[r].n, &FALSE_SCHEMA);
        ok = neg_push(out, typed_kw(4, "properties", p));
      }
    } else if (jv_str_is(key, "properties")) {
      for (uint32_t r = 0; ok && (T & 4) && v->kind == JV_OBJ && r < v->n; r++) {
        const jv_t *nd = negate(c, &v->items[r], depth + 1, 127);
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
        const jv_t *nd = negate(c, v, depth + 1, 127);
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
        const jv_t *nd = negate(c, &v->items[a], depth + 1, U);
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
      bool other = (in_list(key, STR_KW) && !(T & 16)) || (in_list(key, NUM_KW) && !(T & 96)) ||
                   (in_list(key, ARR_KW) && !(T & 8)) || (in_list(key, OBJ_KW) && !(T & 4));
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
static const jv_t *without_not(cx_t *c, const jv_t *s) {
  const jv_t *n = s && s->kind == JV_OBJ ? jv_get(s, "not") : 0;
  if (!n || c->err) return s;
  if (ignored(c, "not")) return s;
  uint32_t at = ptr_pushs(c, "not");
  static const char *const drop[] = {"not", 0};
  const jv_t *rest = obj_without(s, drop);
  const jv_t *nd = negate(c, n, 0, kinds_of(c, rest));
  ptr_pop(c, at);
  if (c->err) return 0;
  if (!nd) { UNSUPPORTED(c, "not", "its operand's complement is not expressible here"); return 0; }
  if (!nd->n) return &FALSE_SCHEMA;
  jv_t *any = jv_new(JV_OBJ);
  jv_obj_put(any, "anyOf", 5, nd);
  return rest->n ? all_of2(rest, any) : any;
}

/* Where the compiler stands, to try a form and take it back. */
typedef struct { uint32_t n_keys, ptr_n, log_n, b_n; } mark_t;

static mark_t mark(cx_t *c, const sb_t *b) { return (mark_t){c->n_keys, c->ptr.n, c->out->log.n, b->n}; }

static void take_back(cx_t *c, sb_t *b, mark_t m) {
  aici_free(c->err);
  c->err = 0;
  for (uint32_t i = m.n_keys; i < c->n_keys; i++) aici_free(c->ptrs[i]), aici_free(c->texts[i].text);
  c->n_keys = m.n_keys;
  ptr_pop(c, m.ptr_n);
  c->out->log.n = m.log_n;
  b->n = m.b_n;
  if (b->p) b->p[m.b_n] = 0;
}

static bool obviously_empty(cx_t *c, const jv_t *s, uint32_t depth);

/* oneOf exactly, by complements: branch i's alternatives are rest and B_i and, for every other
 * branch j, one disjunct of not B_j (the complements distributed). False, with nothing emitted
 * and no error, when a complement has no form here, the alternatives would be over
 * ONE_OF_TERMS or their text over ONE_OF_BYTES (with the machines they made). */
static bool emit_one_of_by_complements(cx_t *c, sb_t *b, const jv_t *alts, const jv_t *rest, bool siblings) {
  uint32_t n = alts->n;
  mark_t m = mark(c, b);
  const jv_t **neg = aici_calloc(n * n, sizeof(void *));   /* neg[i * n + j]: not B_j, within B_i's kinds */
  uint64_t terms = 0;
  bool ok = true;
  uint32_t within = kinds_of(c, rest);
  for (uint32_t i = 0; i < n && ok && terms <= ONE_OF_TERMS; i++) {
    uint32_t U = kinds_of(c, &alts->items[i]) & within;
    uint64_t t = U ? 1 : 0;
    for (uint32_t j = 0; j < n && t && ok; j++)
      if (j != i) {
        ok = (neg[i * n + j] = negate(c, &alts->items[j], 0, U)) != 0;
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
  sb_puts(b, "(?:");
  bool first = true;
  for (uint32_t i = 0; i < n && !c->err; i++) {
    const jv_t **ng = neg + i * n;
    bool empty = false;
    for (uint32_t j = 0; j < n; j++) empty |= j != i && (!ng[j] || !ng[j]->n), pick[j] = 0;
    if (empty) continue;               /* B_j admits every value B_i may: B_i never alone */
    for (;;) {
      const jv_t *alt = siblings ? all_of2(rest, &alts->items[i]) : &alts->items[i];
      for (uint32_t j = 0; j < n; j++)
        if (j != i) alt = all_of2(alt, &ng[j]->items[pick[j]]);
      uint32_t at = ptr_pushs(c, "oneOf");
      ptr_pushi(c, i);
      if (!obviously_empty(c, alt, 0)) {
        if (!first) sb_putc(b, '|');
        first = false;
        emit(c, b, alt);
      }
      ptr_pop(c, at);
      uint64_t bytes = b->n - m.b_n;
      for (uint32_t k = m.n_keys; k < c->n_keys; k++) bytes += c->texts[k].len;
      if (!c->err && bytes > ONE_OF_BYTES) fail(c, "too large: ", "oneOf", 0);   /* taken back below */
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
  if (first) sb_puts(b, "[^\\x00-\\xff]");
  sb_putc(b, ')');
  aici_free(pick), aici_free(neg);
  if (c->err) { take_back(c, b, m); return false; }
  return true;
}

/* A schema no value meets, by a look at its keywords (false, `type: []`, `enum: []`, literals
 * of none of its types, an object-only schema with a required key whose value is such a schema):
 * alternatives so made are not written (the distributed complements of an exact oneOf make
 * many). False says nothing. */
static bool obviously_empty(cx_t *c, const jv_t *s, uint32_t depth) {
  if (depth > 4 || c->err || !s || (s->kind == JV_OBJ && jv_get(s, "$ref"))) return false;
  s = flatten(c, s);
  if (!s || c->err) return false;
  if (s->kind == JV_FALSE) return true;
  if (s->kind != JV_OBJ) return false;
  const jv_t *t = jv_get(s, "type"), *e = jv_get(s, "enum"), *k = jv_get(s, "const");
  uint32_t T = t ? type_bits(t) : 127;
  if (t && !T && t->kind == JV_ARR) return true;
  if (!k && e && e->kind == JV_ARR && (!e->n || !(kinds_of(c, s) & T))) return true;
  if (k && !(kinds_of(c, s) & T)) return true;
  const jv_t *req = jv_get(s, "required");
  for (uint32_t i = 0; T == 4 && req && req->kind == JV_ARR && i < req->n; i++) {
    if (req->items[i].kind != JV_STR) continue;
    const jv_t *v = value_schema(c, s, &req->items[i]);
    if (v && obviously_empty(c, v, depth + 1)) return true;
  }
  return false;
}

/* ---- the dispatcher -------------------------------------------------------------------------- */
static void emit_alts(cx_t *c, sb_t *b, const jv_t *s, const char *kw) {
  const jv_t *alts = jv_get(s, kw);
  if (!alts || alts->kind != JV_ARR || !alts->n) { fail(c, "bad schema: ", kw, "not a non-empty array"); return; }
  const char *const drop[] = {kw, 0};  /* oneOf first: a sibling anyOf is distributed in */
  const jv_t *rest = obj_without(s, drop);
  bool siblings = false;
  for (uint32_t i = 0; i < rest->n; i++) siblings |= is_constraint_key(&rest->keys[i]);
  uint32_t excluded = 0;
  if (kw[0] == 'o' && !one_of_exact(c, alts, rest, &excluded) && !c->err) {
    excluded = 0;
    if (emit_one_of_by_complements(c, b, alts, rest, siblings)) return;
    if (c->o->coerce_one_of) relax(c, "oneOf (as anyOf: option coerce_one_of)");
    else { UNSUPPORTED(c, "oneOf", "branches that may overlap; the option coerce_one_of compiles it as anyOf"); return; }
  }
  if (c->err) return;
  jv_t *only = 0;                      /* the kinds no value of which matches exactly one branch, out */
  if (excluded) {
    only = jv_new(JV_OBJ);
    jv_obj_put(only, "type", 4, types_value(127 & ~excluded));
  }
  sb_puts(b, "(?:");
  bool first = true;
  for (uint32_t i = 0; i < alts->n && !c->err; i++) {
    uint32_t at = ptr_pushs(c, kw);
    ptr_pushi(c, i);
    const jv_t *alt = siblings ? all_of2(rest, &alts->items[i]) : &alts->items[i];
    if (only) alt = all_of2(alt, only);
    if (!obviously_empty(c, alt, 0)) {
      if (!first) sb_putc(b, '|');
      first = false;
      emit(c, b, alt);
    }
    ptr_pop(c, at);
  }
  if (first) sb_puts(b, "[^\\x00-\\xff]");
  sb_putc(b, ')');
}

/* Literals beside a string schema's own keywords only (type, pattern, format, minLength,
 * maxLength): each decided exactly, a string by the pattern's and the format's regexes on its
 * canonical content and its length in code points (an astral character, a surrogate pair in
 * the schema's text, is one), any other value by `type` alone. False: `rest` is no such schema,
 * or a keyword there cannot be compiled (the caller then checks on one regex). */
static bool literals_by_string_keywords(cx_t *c, const jv_t *rest, const jv_t *v, uint32_t n, bool *keep) {
  static const char *const OWN[] = {"type", "pattern", "format", "minLength", "maxLength", 0};
  for (uint32_t i = 0; i < rest->n; i++)
    if (is_constraint_key(&rest->keys[i]) && !in_list(&rest->keys[i], OWN)) return false;
  const jv_t *t = jv_get(rest, "type"), *pat = jv_get(rest, "pattern"), *fmt = jv_get(rest, "format");
  const jv_t *mn = jv_get(rest, "minLength"), *mx = jv_get(rest, "maxLength");
  if ((pat && pat->kind != JV_STR) || (fmt && fmt->kind != JV_STR) || (mn && mn->kind != JV_NUM) || (mx && mx->kind != JV_NUM))
    return false;
  if (fmt && ignored(c, "format")) relax(c, "format"), fmt = 0;
  uint32_t bits = t ? type_bits(t) : 127;
  aici_regex_t *re[2] = {0, 0};
  for (uint32_t k = 0; k < 2; k++) {
    const jv_t *src = k ? fmt : pat;
    if (!src) continue;
    sb_t r = {0};
    const char *why = 0;
    bool ok = k ? emit_format(&r, src->s) : emit_pattern(&r, src->s, src->n, &why);
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
    sb_t w = {0};                      /* the canonical content: the text without its quotes */
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
static void emit_literals(cx_t *c, sb_t *b, const jv_t *s) {
  const jv_t *k = jv_get(s, "const"), *e = jv_get(s, "enum");
  if (e && e->kind != JV_ARR) { fail(c, "bad schema: ", "enum", "not an array"); return; }
  static const char *const drop[] = {"enum", "const", NOT_IN, 0};
  const jv_t *rest = obj_without(s, drop), *not_in = jv_get(s, NOT_IN);
  bool constrained = false;
  for (uint32_t i = 0; i < rest->n; i++) constrained |= is_constraint_key(&rest->keys[i]);
  aici_regex_t *re = 0;
  uint32_t n_lit = k ? 1 : e->n;
  bool *keep_exact = aici_malloc(n_lit + 1);
  bool exact = constrained && literals_by_string_keywords(c, rest, k ? k : e->items, n_lit, keep_exact);
  if (constrained && !exact) {         /* keep the literals that the rest's language holds */
    sb_t r = {0};
    uint32_t nm = c->n_keys;
    uint64_t longest = 0, saved = c->flat_cap;
    for (uint32_t i = 0; i < (k ? 1 : e->n); i++) {
      const jv_t *v = k ? k : &e->items[i];
      sb_t t = {0};                    /* its text's bytes bound every string in it, in characters */
      jv_write(&t, v);
      if (t.n > longest) longest = t.n;
      aici_free(t.p);
    }
    c->flat_cap = longest + 1;         /* no string machine: a literal's text is checked by one regex */
    emit(c, &r, rest);
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
  sb_puts(b, "(?:");
  bool any = false;
  uint32_t n = k ? 1 : e->n;
  for (uint32_t i = 0; i < n; i++) {
    const jv_t *v = k ? k : &e->items[i];
    sb_t t = {0};
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
      if (any) sb_putc(b, '|');
      sb_lit(b, t.p, t.n);
      any = true;
    }
    aici_free(t.p);
  }
  if (!any) sb_puts(b, "[^\\x00-\\xff]");
  sb_putc(b, ')');
  aici_free(keep_exact);
}

static void emit_schema(cx_t *c, sb_t *b, const jv_t *s);

static void emit(cx_t *c, sb_t *b, const jv_t *s) {
  if (c->err) return;
  if (++c->depth > 48) {
    UNSUPPORTED(c, "schema", "nested over 48 levels inline, as a recursion through allOf is");
  } else {
    emit_schema(c, b, s);
  }
  c->depth--;
}

static void emit_schema(cx_t *c, sb_t *b, const jv_t *s) {
  if (s == &ANY_MARK || s->kind == JV_TRUE) { emit_any_value(c, b); return; }
  if (s->kind == JV_FALSE) { sb_puts(b, "[^\\x00-\\xff]"); return; }
  if (s->kind != JV_OBJ) { fail(c, "bad schema: ", "schema", "expected an object or a boolean"); return; }
  if (!check_values(c, s)) return;
  if (jv_get(s, "not")) {              /* written as its operand's complement */
    const jv_t *r = without_not(c, s);
    if (!r || c->err) return;
    if (r != s) { emit(c, b, r); return; }
  }
  if (!check_keywords(c, s)) return;
  const jv_t *r = jv_get(s, "$ref");
  if (r && !jv_get(s, "allOf")) {
    bool siblings = false;
    for (uint32_t i = 0; i < s->n; i++) siblings |= !jv_str_is(&s->keys[i], "$ref") && is_constraint_key(&s->keys[i]);
    if (!siblings) {                   /* a call: one machine per target, recursion included */
      const jv_t *t = resolve(c, r);
      if (!t) return;
      uint32_t m = machine_for(c, t, 2, r->s, r->n);   /* compiled later, named by the ref */
      if (c->err) return;
      emit_call(c, b, m);
      return;
    }
  }
  if (jv_get(s, "allOf") || r) {
    const jv_t *m = flatten(c, s);
    if (!m || c->err) return;
    emit(c, b, m);
    return;
  }
  if (jv_get(s, "oneOf")) { emit_alts(c, b, s, "oneOf"); return; }
  if (jv_get(s, "anyOf")) { emit_alts(c, b, s, "anyOf"); return; }
  if (jv_get(s, "enum") || jv_get(s, "const")) { emit_literals(c, b, s); return; }
  const jv_t *t = jv_get(s, "type");
  uint32_t bits = t ? type_bits(t) : 127;
  if (t && !bits) {
    if (t->kind == JV_ARR && t->n == 0) { sb_puts(b, "[^\\x00-\\xff]"); return; }
    fail(c, "bad schema: ", "type", "unknown type name");
    return;
  }
  sb_puts(b, "(?:");
  bool first = true;
#define ALT() (sb_puts(b, first ? "" : "|"), first = false)
  if (bits & 1) ALT(), sb_puts(b, "null");
  if (bits & 2) ALT(), sb_puts(b, "true|false");
  if (bits & 4) ALT(), emit_object(c, b, s);
  if (bits & 8) ALT(), emit_array(c, b, s);
  if (bits & 16) ALT(), emit_string(c, b, strings_of(c, s));
  if (bits & 64) ALT(), emit_num(c, b, s, false);
  else if (bits & 32) ALT(), emit_num(c, b, s, true);
#undef ALT
  sb_putc(b, ')');
}

bool schema_compile(const jv_t *schema, const json_opts_t *o, compiled_t *out, char **err) {
  cx_t c = {.root = schema, .o = o, .out = out};
  if (o->whitespace) {
    sb_t w = {0};
    sb_puts(&w, "[\\x20\\x0a\\x0d\\x09]{0,");
    sb_uint(&w, o->whitespace > 64 ? 64 : o->whitespace);
    sb_putc(&w, '}');
    __builtin_memcpy(c.ws, w.p, w.n + 1);
    aici_free(w.p);
  }
  machine_for(&c, schema, 0, "#", 1);
  for (uint32_t i = 0; i < c.n_keys && !c.err; i++) {
    if (!c.pending[i]) continue;       /* written already (free-form values, outlined schemas) */
    const jv_t *s = c.pending[i];
    aici_free(c.ptr.p);
    c.ptr = (sb_t){0};
    if (c.ptrs[i][0] && c.ptrs[i][1]) sb_puts(&c.ptr, c.ptrs[i]);   /* "#" alone: the root */
    sb_t text = {0};
    emit(&c, &text, s);
    set_text(&c, i, text.p ? text.p : "", text.n);
    aici_free(text.p);
  }
  uint64_t total = 0;                  /* a checked limit on the regex text: its DFAs grow with it */
  for (uint32_t i = 0; i < c.n_keys; i++) total += c.texts[i].len;
  if (!c.err && total > TEXT_MAX) {
    sb_t m = {0};
    sb_puts(&m, "too large: schema at # (its ");
    sb_uint(&m, c.n_keys);
    sb_puts(&m, " machines' regexes take ");
    sb_uint(&m, total);
    sb_puts(&m, " bytes; at most 2 MiB: split it, or use fewer properties or literals)");
    c.err = m.p;
  }
  for (uint32_t i = 0; i < c.n_keys; i++) aici_free(c.ptrs[i]);
  out->m = c.texts, out->n = c.n_keys;
  aici_free(c.keys), aici_free(c.pending), aici_free(c.ptrs), aici_free(c.ptr.p);
  if (c.err) { *err = c.err; return false; }
  return true;
}
