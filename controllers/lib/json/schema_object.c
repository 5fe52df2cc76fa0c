/* JSON Schema arrays, objects (properties in order or any order, patternProperties and key
 * languages, additionalProperties) and free-form values to regex text: part of the schema
 * compiler (schema_int.h). */
#include "schema_int.h"

/* ---- arrays ---------------------------------------------------------------------------------- */
void sc_emit_array(cx_t *c, aici_buf_t *b, const jv_t *s) {
  const char *ws = c->ws;
  uint64_t min = 0, max = 0;
  sc_get_uint(c, s, "minItems", &min);
  bool bounded = sc_get_uint(c, s, "maxItems", &max);
  const jv_t *items = jv_get(s, "items"), *prefix = jv_get(s, "prefixItems"), *rest = items;
  const char *prefix_kw = "prefixItems";
  if (items && items->kind == JV_ARR) {          /* draft 4-7 tuple form */
    prefix = items, prefix_kw = "items";
    rest = jv_get(s, "additionalItems");
  }
  if (!rest) rest = &ANY_MARK;
  bool rest_ok = rest->kind != JV_FALSE;
  uint32_t np = prefix && prefix->kind == JV_ARR ? prefix->n : 0;
  if (bounded && max < min) { aici_buf_puts(b, "[^\\x00-\\xff]"); return; }
  if (min > 10000 || (bounded && max > 10000)) { UNSUPPORTED(c, bounded ? "maxItems" : "minItems", "over 10000"); return; }
  if (!rest_ok && min > np) { aici_buf_puts(b, "[^\\x00-\\xff]"); return; }
  if (!rest_ok && (!bounded || max > np)) max = np, bounded = true;
  aici_buf_puts(b, "\\["), aici_buf_puts(b, ws);
  /* prefix items nest: [p0(,p1(,p2 rest?)?)?]; the first `min` are not optional */
  uint32_t opened = 0, k;
  uint64_t limit = bounded ? max : (uint64_t)-1;
  for (k = 0; k < np && k < limit; k++) {
    bool optional = k >= min;
    if (optional) aici_buf_puts(b, "(?:");
    if (k) aici_buf_puts(b, ws), aici_buf_puts(b, ","), aici_buf_puts(b, ws);
    uint32_t at = sc_ptr_pushs(c, prefix_kw);
    sc_ptr_pushi(c, k);
    sc_emit_value(c, b, &prefix->items[k]);
    sc_ptr_pop(c, at);
    if (c->err) return;
    opened += optional;
  }
  if (rest_ok && k < limit) {
    uint64_t rmin = min > k ? min - k : 0, rmax = bounded ? max - k : 0;
    uint32_t at = rest == items ? sc_ptr_pushs(c, "items") : rest == &ANY_MARK ? c->ptr.n : sc_ptr_pushs(c, "additionalItems");
    aici_buf_t e = {0};
    sc_emit_value(c, &e, rest);
    sc_ptr_pop(c, at);
    if (c->err) return;
    /* rest items: k == 0: (E(,E){rmin-1,rmax-1})?   k > 0: (,E){rmin,rmax} */
    bool first = k == 0;
    if (first) {
      if (!rmin) aici_buf_puts(b, "(?:");
      aici_buf_putn(b, e.p, e.n);
      if (rmin) rmin--;
      if (bounded) rmax--;
    }
    if (!bounded || rmax > 0) {
      aici_buf_puts(b, "(?:"), aici_buf_puts(b, ws), aici_buf_puts(b, ","), aici_buf_puts(b, ws), aici_buf_putn(b, e.p, e.n), aici_buf_puts(b, "){");
      sb_uint(b, rmin), aici_buf_putc(b, ',');
      if (bounded) sb_uint(b, rmax);
      aici_buf_putc(b, '}');
    }
    if (first && !(min > 0)) aici_buf_puts(b, ")?");
    aici_free(e.p);
  }
  for (; opened; opened--) aici_buf_puts(b, ")?");
  aici_buf_puts(b, ws), aici_buf_puts(b, "\\]");
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
static void emit_early_ends(aici_buf_t *b, ktrie_t *t, uint32_t node) {
  knode_t *x = &t->n[node];
  aici_buf_puts(b, "(?:");
  bool first = true;
  if (!x->terminal) first = false;     /* the empty alternative: end here */
  for (uint32_t j = 0; j < x->n_kids; j++) {
    if (!first) aici_buf_putc(b, '|');
    first = false;
    cp_set_t one = {0};
    aici_cps_add(&one, x->kid_cp[j], x->kid_cp[j]);
    emit_cp_set(b, &one);
    aici_free(one.r);
    emit_early_ends(b, t, t->n[node].kid[j]);
  }
  if (first) aici_buf_puts(b, "[^\\x00-\\xff]");
  aici_buf_putc(b, ')');
}

static void emit_divergences(aici_buf_t *b, ktrie_t *t, uint32_t node) {
  knode_t *x = &t->n[node];
  cp_set_t other = {0}, low = {0};     /* not children: above \ (raw), and up to \ (escapes too) */
  for (uint32_t j = 0; j < x->n_kids; j++) aici_cps_add(&other, x->kid_cp[j], x->kid_cp[j]);
  aici_cps_add(&other, 0, 0x5c);
  aici_cps_negate(&other);
  for (uint32_t c = 0, run = 0; c <= 0x5d; c++) {   /* [0, \\] less the children, as runs */
    bool kid = c == 0x5d;
    for (uint32_t j = 0; j < x->n_kids && !kid; j++) kid = x->kid_cp[j] == c;
    if (kid && c > run) aici_cps_add(&low, run, c - 1);
    if (kid) run = c + 1;
  }
  aici_buf_puts(b, "(?:");
  emit_cp_set(b, &other);
  if (low.n) aici_buf_putc(b, '|'), emit_cp_set(b, &low);
  aici_free(low.r), aici_free(other.r);
  for (uint32_t j = 0; j < x->n_kids; j++) {
    aici_buf_putc(b, '|');
    cp_set_t one = {0};
    aici_cps_add(&one, x->kid_cp[j], x->kid_cp[j]);
    emit_cp_set(b, &one);
    aici_free(one.r);
    emit_divergences(b, t, t->n[node].kid[j]);
  }
  aici_buf_putc(b, ')');
}

static void emit_not_keys(aici_buf_t *b, ktrie_t *t, uint32_t node) {
  aici_buf_puts(b, "(?:");
  emit_early_ends(b, t, node);
  aici_buf_putc(b, '|');
  emit_divergences(b, t, node);
  emit_strchar(b);
  aici_buf_puts(b, "*)");
}

static bool is_required(const jv_t *req, const jv_t *key) {
  if (!req || req->kind != JV_ARR) return false;
  for (uint32_t i = 0; i < req->n; i++)
    if (req->items[i].kind == JV_STR && req->items[i].n == key->n && !__builtin_memcmp(req->items[i].s, key->s, key->n))
      return true;
  return false;
}

typedef struct { aici_buf_t text; bool required; } prop_t;

/* Is the JSON text of a key in the language of a string-content regex? */
static bool key_matches(const char *re_text, uint32_t re_len, const jv_t *key) {
  aici_regex_t *re = aici_regex_compile(re_text, re_len, 0);
  if (!re) return true;                /* cannot tell: the caller refuses */
  aici_buf_t t = {0};
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
static aici_buf_t *pattern_texts(cx_t *c, const jv_t *pp) {
  uint32_t at = sc_ptr_pushs(c, "patternProperties");
  aici_buf_t *pats = aici_calloc(pp->n + 1, sizeof(aici_buf_t));
  for (uint32_t i = 0; i < pp->n && !c->err; i++) {
    uint32_t at2 = sc_ptr_push(c, pp->keys[i].s, pp->keys[i].n);
    const char *why = 0;
    if (!emit_pattern(&pats[i], pp->keys[i].s, pp->keys[i].n, &why)) UNSUPPORTED(c, "patternProperties", why);
    for (uint32_t j = 0; !c->err && j < i; j++)
      if (!regex_disjoint(pats[i].p, pats[i].n, pats[j].p, pats[j].n)) UNSUPPORTED(c, "patternProperties", "patterns that may match one key");
    sc_ptr_pop(c, at2);
  }
  sc_ptr_pop(c, at);
  if (c->err) {
    for (uint32_t i = 0; i < pp->n; i++) aici_free(pats[i].p);
    aici_free(pats);
    return 0;
  }
  return pats;
}

/* `val` (NULL: none yet) with the schema of every pattern the key matches; NULL if none does. */
static const jv_t *with_patterns(const jv_t *val, const jv_t *key, const jv_t *pp, const aici_buf_t *pats) {
  for (uint32_t i = 0; pp && i < pp->n; i++)
    if (key_matches(pats[i].p, pats[i].n, key)) val = val ? sc_all_of2(val, &pp->items[i]) : &pp->items[i];
  return val;
}


/* The key contents of a key language (keylang.c) as machines; false when it is too large. The
 * start is inline when it is the plain STRCHAR*. */
bool sc_emit_keylang(cx_t *c, aici_buf_t *b, const aici_buf_t *pats, uint32_t n_pats, int32_t target, const aici_buf_t *keys) {
  const char *texts[64];
  uint32_t lens[64];
  for (uint32_t i = 0; i < n_pats && i < 64; i++) texts[i] = pats[i].p ? pats[i].p : "", lens[i] = pats[i].n;
  keylang_t *L = keylang_new(texts, lens, n_pats, target, keys->p, keys->n, KEYLANG_STATES);
  if (!L || c->n_keys + keylang_machines(L) > MAX_MACHINES) { keylang_free(L); return false; }
  if (keylang_empty(L)) {
    aici_buf_puts(b, "[^\\x00-\\xff]");
  } else if (keylang_start_is_free(L)) {
    keylang_start_text(L, 0, b);
  } else {
    uint32_t base = c->n_keys;
    const jv_t *marker = jv_new(JV_NULL);   /* fresh: these machines are found by no other schema */
    for (uint32_t i = 0; i < keylang_machines(L) && !c->err; i++) {
      key_arg = i;
      uint32_t m = sc_machine_for(c, marker, MK_KEYLANG, 0, 0);
      key_arg = 0;
      aici_buf_t t = {0};
      keylang_text(L, i, base, &t);
      if (!c->err) sc_set_text(c, m, t.p, t.n);
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
static void emit_pattern_props(cx_t *c, aici_buf_t *add, const jv_t *pp, const aici_buf_t *pats, const aici_buf_t *keys,
                               const jv_t *addl) {
  uint32_t at = sc_ptr_pushs(c, "patternProperties");
  for (uint32_t i = 0; i <= pp->n && !c->err; i++) {
    bool rest = i == pp->n;            /* the keys that match no pattern */
    if (rest && addl && addl->kind == JV_FALSE) break;
    if (!rest && pp->items[i].kind == JV_FALSE) continue;
    uint32_t at2;
    if (rest) sc_ptr_pop(c, at), at2 = sc_ptr_pushs(c, "additionalProperties");
    else at2 = sc_ptr_push(c, pp->keys[i].s, pp->keys[i].n);
    aici_buf_t k = {0};
    aici_buf_puts(&k, "\\x22");
    /* a pattern that matches no listed key: its own text; else the product (keylang.c) */
    bool listed_match = !rest && keys->n && !regex_disjoint(pats[i].p, pats[i].n, keys->p, keys->n), ok = true;
    if (!rest && !listed_match) aici_buf_putn(&k, pats[i].p, pats[i].n);
    else ok = sc_emit_keylang(c, &k, pats, pp->n, rest ? -1 : (int32_t)i, keys);
    aici_buf_puts(&k, "\\x22");
    if (!ok && !rest) UNSUPPORTED(c, "patternProperties", "a pattern that matches listed keys, too large to take them out");
    if (ok && !c->err) {               /* !ok and rest: keys matching no pattern not offered (narrower) */
      if (add->n) aici_buf_putc(add, '|');
      aici_buf_putn(add, k.p, k.n);
      aici_buf_puts(add, c->ws), aici_buf_putc(add, ':'), aici_buf_puts(add, c->ws);
      sc_emit_value(c, add, rest ? (addl ? addl : &ANY_MARK) : &pp->items[i]);
    }
    aici_free(k.p);
    sc_ptr_pop(c, at2);
  }
  sc_ptr_pop(c, at);
  if (add->n) {                        /* one alternation, as one additional-property entry */
    aici_buf_t t = {0};
    aici_buf_puts(&t, "(?:"), aici_buf_putn(&t, add->p, add->n), aici_buf_putc(&t, ')');
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
static void emit_members(aici_buf_t *b, const prop_t *p, uint32_t n, const aici_buf_t *add, bool nonempty, const char *ws) {
#define SEP() (aici_buf_puts(b, ws), aici_buf_putc(b, ','), aici_buf_puts(b, ws))
#define ADDS() (add ? (aici_buf_puts(b, "(?:"), SEP(), aici_buf_putn(b, add->p, add->n), aici_buf_puts(b, ")*")) : (void)0)
  uint32_t r = 0;
  while (r < n && !p[r].required) r++;
  if (!n) {
    if (add) aici_buf_puts(b, "(?:"), aici_buf_putn(b, add->p, add->n), ADDS(), aici_buf_puts(b, nonempty ? ")" : ")?");
    else if (nonempty) aici_buf_puts(b, "[^\\x00-\\xff]");
    return;
  }
  if (r) aici_buf_puts(b, "(?:");            /* r < n: (?:X_{r-1},)?; r == n: the alternatives */
  for (uint32_t i = 1; i < r; i++) aici_buf_puts(b, "(?:");
  if (r) aici_buf_putn(b, p[0].text.p, p[0].text.n);
  for (uint32_t i = 1; i < r; i++) {
    aici_buf_puts(b, "(?:"), SEP(), aici_buf_putn(b, p[i].text.p, p[i].text.n);
    aici_buf_puts(b, ")?|"), aici_buf_putn(b, p[i].text.p, p[i].text.n), aici_buf_putc(b, ')');
  }
  if (r < n) {
    if (r) SEP(), aici_buf_puts(b, ")?");
    aici_buf_putn(b, p[r].text.p, p[r].text.n);
    for (uint32_t j = r + 1; j < n; j++) {
      if (!p[j].required) aici_buf_puts(b, "(?:");
      SEP(), aici_buf_putn(b, p[j].text.p, p[j].text.n);
      if (!p[j].required) aici_buf_puts(b, ")?");
    }
    ADDS();
  } else {
    ADDS();
    if (add) aici_buf_putc(b, '|'), aici_buf_putn(b, add->p, add->n), ADDS();
    aici_buf_puts(b, nonempty ? ")" : ")?");
  }
#undef ADDS
#undef SEP
}

/* The members in any order (anyorder.c): a call to the dynamic machine of "nothing written". */
static void emit_any_order(cx_t *c, aici_buf_t *b, const prop_t *p, uint32_t n, const aici_buf_t *add, bool nonempty) {
  if (!c->out->dyn) c->out->dyn = dyn_new(), c->out->dyn_write = dyn_text;
  aici_buf_t *entries = aici_calloc(n + 1, sizeof(aici_buf_t));
  bool *req = aici_calloc(n + 1, 1);
  for (uint32_t i = 0; i < n; i++) entries[i] = p[i].text, req[i] = p[i].required;
  uint32_t obj = dyn_object(c->out->dyn, n, entries, req, add, nonempty, c->ws);
  aici_free(entries), aici_free(req);
  key_arg = obj;
  uint32_t m = sc_machine_for(c, &ANY_MARK, MK_ANY_ORDER, 0, 0);
  key_arg = 0;
  if (c->err) return;
  c->pending[m] = 0;                   /* no text: written when first entered */
  dyn_bind_start(c->out->dyn, obj, m);
  sc_emit_call(c, b, m);
}

void sc_emit_object(cx_t *c, aici_buf_t *b, const jv_t *s) {
  const char *ws = c->ws;
  const jv_t *props = jv_get(s, "properties"), *req = jv_get(s, "required"), *addl = jv_get(s, "additionalProperties");
  if (props && props->kind != JV_OBJ) props = 0;
  const jv_t *pp = jv_get(s, "patternProperties"), *every = 0;
  if (pp && pp->kind == JV_OBJ && pp->n == 1) {
    /* one pattern that every key matches (".*"): its schema applies to the listed properties
     * too, and takes the place of additionalProperties (which then applies to no key) */
    static const char *const ALL_KEYS[] = {"", ".*", "^.*", ".*$", 0};
    if (sc_in_list(&pp->keys[0], ALL_KEYS)) every = &pp->items[0], addl = every, pp = 0;
  }
  if (pp && (pp->kind != JV_OBJ || !pp->n)) pp = 0;
  aici_buf_t *pats = pp ? pattern_texts(c, pp) : 0;
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
    sc_fail(c, "too large: ", "properties", d);
    aici_free(p);
    return;
  }
  p = aici_realloc(p, (np + ne + 1) * sizeof(prop_t));
  __builtin_memset(p, 0, (np + ne + 1) * sizeof(prop_t));
  for (uint32_t i = 0; i < np + ne && !c->err; i++) {
    const jv_t *key = i < np ? &props->keys[i] : &extra->keys[i - np];
    const jv_t *val = i < np ? &props->items[i] : &extra->items[i - np];
    if (every && i < np) val = sc_all_of2(val, every);
    if (i < np) val = with_patterns(val, key, pp, pats);   /* a listed key the patterns match: both */
    bool r = is_required(req, key);
    if (val->kind == JV_FALSE) {
      if (r) { aici_buf_puts(b, "[^\\x00-\\xff]"); aici_free(p); return; }
      continue;
    }
    aici_buf_t *t = &p[n].text;
    aici_buf_t enc = {0};
    jv_write_str(&enc, key->s, key->n);
    sb_lit(t, enc.p, enc.n);
    aici_free(enc.p);
    aici_buf_puts(t, ws), aici_buf_putc(t, ':'), aici_buf_puts(t, ws);
    uint32_t at = i < np ? sc_ptr_pushs(c, "properties") : sc_ptr_pushs(c, "required");
    sc_ptr_push(c, key->s, key->n);
    /* each text is written twice (schema order), or once a key set (any_order) */
    sc_emit_value_within(c, t, val, c->o->any_order ? 128 : np + ne > 32 ? 256 : OUTLINE_BYTES);
    sc_ptr_pop(c, at);
    p[n].required = r, n_req += r;
    n++;
  }
  /* additional properties: keys that are none of the listed ones */
  aici_buf_t add = {0};
  bool has_add = !addl || addl->kind != JV_FALSE;
  if (pp && !c->err) {
    aici_buf_t keys = {0};                   /* the listed keys' contents, one alternation */
    for (uint32_t i = 0; i < np + ne; i++) {
      const jv_t *key = i < np ? &props->keys[i] : &extra->keys[i - np];
      aici_buf_t enc = {0};
      jv_write_str(&enc, key->s, key->n);
      aici_buf_puts(&keys, i ? "|" : "(?:"), sb_lit(&keys, enc.p + 1, enc.n - 2);
      aici_free(enc.p);
    }
    if (keys.n) aici_buf_putc(&keys, ')');
    emit_pattern_props(c, &add, pp, pats, &keys, addl);
    aici_free(keys.p);
    has_add = add.n > 0;
  } else if (has_add && !c->err) {
    ktrie_t kt = {0};
    kt_new(&kt);
    for (uint32_t i = 0; i < np; i++) kt_add(&kt, props->keys[i].s, props->keys[i].n);
    for (uint32_t i = 0; i < ne; i++) kt_add(&kt, extra->keys[i].s, extra->keys[i].n);
    aici_buf_puts(&add, "\\x22");
    emit_not_keys(&add, &kt, 0);
    aici_buf_puts(&add, "\\x22"), aici_buf_puts(&add, ws), aici_buf_putc(&add, ':'), aici_buf_puts(&add, ws);
    uint32_t at = every ? sc_ptr_pushs(c, "patternProperties") : addl ? sc_ptr_pushs(c, "additionalProperties") : c->ptr.n;
    sc_emit_value(c, &add, addl ? addl : &ANY_MARK);
    sc_ptr_pop(c, at);
    for (uint32_t i = 0; i < kt.count; i++) aici_free(kt.n[i].kid_cp), aici_free(kt.n[i].kid);
    aici_free(kt.n);
  }
  uint64_t minp = 0, maxp = 0;
  if (sc_get_uint(c, s, "minProperties", &minp) && minp > n_req && minp > 1) UNSUPPORTED(c, "minProperties", "over 1, and more than the required properties");
  bool nonempty = minp >= 1;           /* minProperties 1: no empty object */
  if (sc_get_uint(c, s, "maxProperties", &maxp) && (has_add || maxp < n)) UNSUPPORTED(c, "maxProperties", "fewer than the properties allowed");
  if (c->err) goto done;
  aici_buf_puts(b, "\\{"), aici_buf_puts(b, ws);
  if (c->o->any_order) emit_any_order(c, b, p, n, has_add ? &add : 0, nonempty);
  else emit_members(b, p, n, has_add ? &add : 0, nonempty, ws);
  aici_buf_puts(b, ws), aici_buf_puts(b, "\\}");
done:
  for (uint32_t i = 0; pats && i < pp->n; i++) aici_free(pats[i].p);
  aici_free(pats);
  for (uint32_t i = 0; i < n; i++) aici_free(p[i].text.p);
  aici_free(p), aici_free(add.p);
}

/* ---- free-form values: one recursive machine ------------------------------------------------- */
void sc_emit_any_value(cx_t *c, aici_buf_t *b) {
  uint32_t m = sc_machine_for(c, &ANY_MARK, 1, 0, 0);
  if (c->err) return;
  if (c->pending[m]) {
    aici_buf_t t = {0};
    const char *ws = c->ws;
    aici_buf_t call = {0};
    sc_emit_call(c, &call, m);
    aici_buf_puts(&t, "null|true|false|");
    bounds_t none = {0};
    const char *why;
    emit_number(&t, false, &none, 0, &why);
    aici_buf_puts(&t, "|\\x22");
    sc_emit_chars(&t, 0, 0, true);
    aici_buf_puts(&t, "\\x22|\\["), aici_buf_puts(&t, ws), aici_buf_puts(&t, "(?:"), aici_buf_putn(&t, call.p, call.n);
    aici_buf_puts(&t, "(?:"), aici_buf_puts(&t, ws), aici_buf_putc(&t, ','), aici_buf_puts(&t, ws), aici_buf_putn(&t, call.p, call.n);
    aici_buf_puts(&t, ")*)?"), aici_buf_puts(&t, ws), aici_buf_puts(&t, "\\]|\\{"), aici_buf_puts(&t, ws);
    aici_buf_t kv = {0};
    aici_buf_puts(&kv, "\\x22"), sc_emit_chars(&kv, 0, 0, true), aici_buf_puts(&kv, "\\x22"), aici_buf_puts(&kv, ws), aici_buf_putc(&kv, ':');
    aici_buf_puts(&kv, ws), aici_buf_putn(&kv, call.p, call.n);
    aici_buf_puts(&t, "(?:"), aici_buf_putn(&t, kv.p, kv.n), aici_buf_puts(&t, "(?:"), aici_buf_puts(&t, ws), aici_buf_putc(&t, ','), aici_buf_puts(&t, ws);
    aici_buf_putn(&t, kv.p, kv.n), aici_buf_puts(&t, ")*)?"), aici_buf_puts(&t, ws), aici_buf_puts(&t, "\\}");
    sc_set_text(c, m, t.p, t.n);
    aici_free(t.p), aici_free(kv.p), aici_free(call.p);
  }
  sc_emit_call(c, b, m);
}
