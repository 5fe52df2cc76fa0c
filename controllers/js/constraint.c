/* Native constraints for scripts (docs/js.md): Regex (the SDK's DFA, the C `regex` controller's
 * matcher) and JsonSchema (the `json` controller's schema compiler and pushdown matcher, compiled
 * in from controllers/json), both with one interface whose states are numbers (0: dead), and
 * Follower, which runs a constraint over the generated tokens natively — backtracking, advancing,
 * stopping and sampling as the C regex and json controllers do — so that a script's step under a
 * constraint costs one native call and no per-token JS.
 *
 * A JsonSchema's configurations (sets of pushdown configurations) are interned as numbered states
 * as they are reached. Its masks share the matcher's one output buffer: a mask is valid until the
 * schema's next mask of another state (a stale TokenSet view throws; copy() keeps one).
 */
#include <stdlib.h>
#include <string.h>

#include "js.h"
#include "matcher.h"
#include "grammar.h"

#define MAX_JSON_STATES (1u << 20)    /* interned configuration sets per JsonSchema */

/* ---- the interface --------------------------------------------------------------------------- */
typedef struct constraint constraint_t;
typedef struct {
  uint32_t (*start)(constraint_t *);
  uint32_t (*advance)(constraint_t *, uint32_t state, const uint8_t *bytes, uint32_t n);   /* 0: dead */
  bool (*accepting)(constraint_t *, uint32_t state);
  bool (*can_continue)(constraint_t *, uint32_t state);
  const aici_tokset_t *(*mask)(constraint_t *, uint32_t state);   /* EOS included where accepting */
  uint32_t (*num_states)(constraint_t *);
} constraint_ops_t;
struct constraint {
  const constraint_ops_t *ops;
  const uint32_t *mask_gen;           /* masks valid while this is unchanged (NULL: for good) */
};

static JSClassID regex_class, json_class, grammar_class, follower_class, result_class;

static constraint_t *constraint_of(JSContext *c, JSValueConst v) {
  JSClassID id;
  void *p = JS_GetAnyOpaque(v, &id);
  if (p && (id == regex_class || id == json_class || id == grammar_class)) return p;
  JS_ThrowTypeError(c, "expected an aici.Regex, aici.JsonSchema or aici.Grammar");
  return 0;
}

static uint32_t eos_token(void) { return aici_eos_token(); }

/* ---- Regex ---------------------------------------------------------------------------------- */
typedef struct {
  constraint_t base;
  aici_regex_t *re;                   /* never freed: the SDK's regex has no free (linear memory) */
  const aici_trie_t *trie;
} regex_c;

static uint32_t re_start(constraint_t *c) { return aici_regex_start(((regex_c *)c)->re); }
static uint32_t re_advance(constraint_t *c, uint32_t st, const uint8_t *b, uint32_t n) {
  return b ? aici_regex_advance(((regex_c *)c)->re, st, b, n) : st;   /* no bytes (special): unchanged, as C */
}
static bool re_accepting(constraint_t *c, uint32_t st) { return aici_regex_accepting(((regex_c *)c)->re, st); }
static bool re_can_continue(constraint_t *c, uint32_t st) { return aici_regex_can_continue(((regex_c *)c)->re, st); }
static const aici_tokset_t *re_mask(constraint_t *c, uint32_t st) {
  regex_c *r = (regex_c *)c;
  aici_tokset_t *m = (aici_tokset_t *)aici_regex_mask_cached(r->re, r->trie, st);   /* cached per state */
  if (aici_regex_accepting(r->re, st)) aici_tokset_allow(m, eos_token());          /* depends on st only */
  return m;
}
static uint32_t re_num_states(constraint_t *c) { return aici_regex_num_states(((regex_c *)c)->re); }
static const constraint_ops_t REGEX_OPS = {re_start, re_advance, re_accepting, re_can_continue, re_mask, re_num_states};

static void regex_finalizer(JSRuntime *r, JSValue v) { free(JS_GetOpaque(v, regex_class)); }

/* A Regex object for `pat` (SyntaxError naming the offset of a bad pattern). */
static JSValue regex_new(JSContext *c, const char *pat, size_t len, const char *what) {
  char *err = 0;
  aici_regex_t *re = aici_regex_compile(pat, len, &err);
  if (!re) {
    JSValue e = JS_ThrowSyntaxError(c, "%s: %s", what, err ? err : "invalid pattern");
    aici_free(err);
    return e;
  }
  const aici_trie_t *trie = get_trie(c);
  if (!trie) return JS_EXCEPTION;
  JSValue obj = JS_NewObjectClass(c, (int)regex_class);
  regex_c *r = malloc(sizeof *r);
  if (JS_IsException(obj) || !r) { free(r); JS_FreeValue(c, obj); return JS_ThrowOutOfMemory(c); }
  *r = (regex_c){{&REGEX_OPS, 0}, re, trie};
  JS_SetOpaque(obj, r);
  return obj;
}

static JSValue regex_ctor(JSContext *c, JSValueConst new_target, int argc, JSValueConst *argv) {
  if (!argc || !JS_IsString(argv[0])) return JS_ThrowTypeError(c, "Regex: the pattern must be a string");
  size_t len;
  const char *pat = JS_ToCStringLen(c, &len, argv[0]);
  if (!pat) return JS_EXCEPTION;
  JSValue r = regex_new(c, pat, len, "Regex");
  JS_FreeCString(c, pat);
  return r;
}

/* aici.choice(strings): a Regex whose language is exactly those strings (a trie of their bytes,
 * as a DFA: every byte but [A-Za-z0-9] escaped), so its masks are native and cached per state. */
#define MAX_CHOICE_OPTIONS (1 << 16)
#define MAX_CHOICE_BYTES (4u << 20)
static JSValue choice_fn(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  JSValueConst arr = argc ? argv[0] : JS_UNDEFINED;
  int64_t n;
  if (!JS_IsArray(arr)) return JS_ThrowTypeError(c, "choice: expected an array of strings");
  if (JS_GetLength(c, arr, &n) < 0) return JS_EXCEPTION;
  if (n < 1 || n > MAX_CHOICE_OPTIONS) return JS_ThrowRangeError(c, "choice: %lld options (1 to %d)", (long long)n, MAX_CHOICE_OPTIONS);
  size_t cap = 1024, len = 0;
  char *pat = malloc(cap);
  if (!pat) return JS_ThrowOutOfMemory(c);
  for (int64_t i = 0; i < n; i++) {
    JSValue e = JS_GetPropertyInt64(c, arr, i);
    size_t sl = 0;
    const char *s = JS_IsString(e) ? JS_ToCStringLen(c, &sl, e) : 0;
    JS_FreeValue(c, e);
    if (!s || !sl || len + 4 * sl + 2 > MAX_CHOICE_BYTES) {
      free(pat);
      if (s) JS_FreeCString(c, s);
      if (JS_HasException(c)) return JS_EXCEPTION;
      if (!s) return JS_ThrowTypeError(c, "choice: options[%lld] is not a string", (long long)i);
      if (!sl) return JS_ThrowRangeError(c, "choice: options[%lld] is empty", (long long)i);
      return JS_ThrowRangeError(c, "choice: the options are over %u bytes escaped", MAX_CHOICE_BYTES);
    }
    while (len + 4 * sl + 2 > cap) cap *= 2;
    char *p = realloc(pat, cap);
    if (!p) { free(pat); JS_FreeCString(c, s); return JS_ThrowOutOfMemory(c); }
    pat = p;
    if (i) pat[len++] = '|';
    for (size_t k = 0; k < sl; k++) {
      unsigned char b = (unsigned char)s[k];
      if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9')) {
        pat[len++] = (char)b;
      } else {
        static const char HEX[] = "0123456789abcdef";
        pat[len++] = '\\', pat[len++] = 'x', pat[len++] = HEX[b >> 4], pat[len++] = HEX[b & 15];
      }
    }
    JS_FreeCString(c, s);
  }
  JSValue r = regex_new(c, pat, len, "choice");
  free(pat);
  return r;
}

/* ---- Grammar ------------------------------------------------------------------------------- */
/* The grammar controller's Earley matcher (Lark or GBNF). It holds one position, saved and
 * restored by marks; a state is a mark on the current path of text: advancing from a state drops
 * the states after it (they no longer lie on the path) and adds one state a token. A state off
 * the path is refused (RangeError), as a stale one. Masks share one buffer, as JsonSchema's. */
typedef struct {
  constraint_t base;
  gr_grammar_t *g;                    /* never freed: the grammar core has no free (linear memory) */
  gr_matcher_t *m;
  const aici_trie_t *trie;
  gr_mark_t *marks;                   /* marks[id] (id 0: dead) */
  uint32_t *depth;                    /* depth[id]: tokens from the start */
  uint32_t *path, n_path;             /* path[d]: the state at depth d of the current text */
  uint32_t n, cap, cur;               /* cur: the state the matcher is at */
  aici_tokset_t *mask;
  uint32_t gen, mask_state;
} grammar_c;

static bool gm_on_path(grammar_c *g, uint32_t st) {
  return st && st < g->n && g->depth[st] < g->n_path && g->path[g->depth[st]] == st;
}
static void gm_goto(grammar_c *g, uint32_t st) {
  if (g->cur != st) gr_restore(g->m, g->marks[st]), g->cur = st;
}
static uint32_t gm_new_state(grammar_c *g, uint32_t depth) {
  if (g->n == g->cap) {
    uint32_t cap = g->cap * 2;
    gr_mark_t *mk = realloc(g->marks, cap * sizeof *mk);
    if (mk) g->marks = mk;
    uint32_t *dp = realloc(g->depth, cap * sizeof *dp);
    if (dp) g->depth = dp;
    uint32_t *pa = realloc(g->path, cap * sizeof *pa);
    if (pa) g->path = pa;
    if (!mk || !dp || !pa) return 0;
    g->cap = cap;
  }
  uint32_t id = g->n++;
  g->marks[id] = gr_save(g->m);
  g->depth[id] = depth;
  g->path[depth] = id;
  g->n_path = depth + 1;
  g->cur = id;
  return id;
}
static uint32_t gm_start(constraint_t *c) { return 1; }
static uint32_t gm_advance(constraint_t *c, uint32_t st, const uint8_t *b, uint32_t n) {
  grammar_c *g = (grammar_c *)c;
  if (!gm_on_path(g, st)) return 0;
  gm_goto(g, st);
  g->n_path = g->depth[st] + 1;       /* the states after st leave the path */
  if (!(b ? gr_advance(g->m, b, n) : false)) {   /* special tokens: refused by the grammar core */
    gr_restore(g->m, g->marks[st]);
    return 0;
  }
  return gm_new_state(g, g->depth[st] + 1);
}
static bool gm_accepting(constraint_t *c, uint32_t st) {
  grammar_c *g = (grammar_c *)c;
  if (!gm_on_path(g, st)) return false;
  gm_goto(g, st);
  return gr_accepting(g->m);
}
static bool gm_can_continue(constraint_t *c, uint32_t st) {
  grammar_c *g = (grammar_c *)c;
  if (!gm_on_path(g, st)) return false;
  gm_goto(g, st);
  return gr_can_continue(g->m);
}
static const aici_tokset_t *gm_mask(constraint_t *c, uint32_t st) {
  grammar_c *g = (grammar_c *)c;
  gm_goto(g, st);
  if (st != g->mask_state) g->gen++, g->mask_state = st;
  gr_mask(g->m, g->trie, eos_token(), g->mask);
  return g->mask;
}
static uint32_t gm_num_states(constraint_t *c) { return ((grammar_c *)c)->n; }
static const constraint_ops_t GRAMMAR_OPS = {gm_start, gm_advance, gm_accepting, gm_can_continue, gm_mask, gm_num_states};

static void grammar_finalizer(JSRuntime *r, JSValue v) {
  grammar_c *g = JS_GetOpaque(v, grammar_class);
  if (!g) return;
  free(g->marks);
  free(g->depth);
  free(g->path);
  aici_tokset_free(g->mask);
  free(g);
}

/* new aici.Grammar(text, {syntax: "lark" | "gbnf"}): Lark unless the first definition uses ::=. */
static JSValue grammar_ctor(JSContext *c, JSValueConst new_target, int argc, JSValueConst *argv) {
  if (!argc || !JS_IsString(argv[0])) return JS_ThrowTypeError(c, "Grammar: the grammar must be a string (Lark or GBNF)");
  int syntax = 0;   /* 0: detect, 1: lark, 2: gbnf */
  if (argc > 1 && !JS_IsUndefined(argv[1])) {
    if (!JS_IsObject(argv[1])) return JS_ThrowTypeError(c, "Grammar: options must be an object {syntax}");
    JSPropertyEnum *props;
    uint32_t np;
    if (JS_GetOwnPropertyNames(c, &props, &np, argv[1], JS_GPN_STRING_MASK | JS_GPN_ENUM_ONLY)) return JS_EXCEPTION;
    for (uint32_t i = 0; i < np; i++) {
      const char *k = JS_AtomToCString(c, props[i].atom);
      bool ok = k && !strcmp(k, "syntax");
      JS_FreeCString(c, k);
      if (!ok) { JS_FreePropertyEnum(c, props, np); return JS_ThrowTypeError(c, "Grammar: unknown option (options: syntax)"); }
    }
    JS_FreePropertyEnum(c, props, np);
    JSValue v = JS_GetPropertyStr(c, argv[1], "syntax");
    const char *sx = JS_IsString(v) ? JS_ToCString(c, v) : 0;
    JS_FreeValue(c, v);
    if (sx && !strcmp(sx, "lark")) syntax = 1;
    else if (sx && !strcmp(sx, "gbnf")) syntax = 2;
    JS_FreeCString(c, sx);
    if (!syntax) return JS_ThrowTypeError(c, "Grammar: syntax must be \"lark\" or \"gbnf\"");
  }
  size_t len;
  const char *text = JS_ToCStringLen(c, &len, argv[0]);
  if (!text) return JS_EXCEPTION;
  char *err = 0;
  gr_grammar_t *gram = syntax == 1 ? gr_compile_lark(text, (uint32_t)len, &err)
                     : syntax == 2 ? gr_compile_gbnf(text, (uint32_t)len, &err) : gr_compile(text, (uint32_t)len, &err);
  JS_FreeCString(c, text);
  if (!gram) {
    JSValue e = JS_ThrowSyntaxError(c, "Grammar: %s", err ? err : "invalid grammar");
    aici_free(err);
    return e;
  }
  const aici_trie_t *trie = get_trie(c);
  if (!trie) return JS_EXCEPTION;
  gr_prepare_tokenizer(trie);   /* the grammar core's trie slices: once per instance (idempotent) */
  grammar_c *g = calloc(1, sizeof *g);
  JSValue obj = JS_NewObjectClass(c, (int)grammar_class);
  if (JS_IsException(obj) || !g) { free(g); JS_FreeValue(c, obj); return JS_ThrowOutOfMemory(c); }
  g->base = (constraint_t){&GRAMMAR_OPS, &g->gen};
  g->g = gram, g->trie = trie, g->m = gr_matcher_new(gram), g->cap = 64, g->n = 1;
  g->marks = malloc(g->cap * sizeof *g->marks), g->depth = malloc(g->cap * 4), g->path = malloc(g->cap * 4);
  g->mask = aici_tokset_new();
  g->mask_state = 0;
  JS_SetOpaque(obj, g);
  if (!g->m || !g->marks || !g->depth || !g->path || !g->mask || !gm_new_state(g, 0)) {
    JS_FreeValue(c, obj);
    return JS_ThrowOutOfMemory(c);
  }
  return obj;
}

/* ---- JsonSchema ------------------------------------------------------------------------------ */
typedef struct {
  constraint_t base;
  matcher_t *m;
  const aici_trie_t *trie;
  cset_t *sets;                       /* sets[id]: state id's configurations (sets[0]: dead) */
  uint32_t n, cap;
  uint32_t *slots, n_slots;           /* open addressing: state ids by hash (0: empty) */
  uint32_t gen, mask_state;           /* the output buffer holds mask_state's mask, generation gen */
} json_c;

static void canonical(cset_t *s) {   /* sorted, unused entries zero: equal sets, equal bytes */
  for (uint32_t i = 1; i < s->n; i++) {
    cfg_t x = s->c[i];
    uint32_t j = i;
    while (j && (s->c[j - 1].m > x.m || (s->c[j - 1].m == x.m && (s->c[j - 1].s > x.s ||
                 (s->c[j - 1].s == x.s && s->c[j - 1].parent > x.parent))))) {
      s->c[j] = s->c[j - 1];
      j--;
    }
    s->c[j] = x;
  }
  memset(&s->c[s->n], 0, (MAX_CFGS - s->n) * sizeof(cfg_t));
}

static uint32_t set_hash(const cset_t *s) {
  uint32_t h = 2166136261u ^ s->n;
  const uint32_t *w = (const uint32_t *)s->c;
  for (uint32_t i = 0; i < s->n * 3; i++) h = (h ^ w[i]) * 16777619u;
  return h;
}

/* The id of `s` (interned now if new; 0 when it is empty or the table is full). */
static uint32_t intern(json_c *j, cset_t *s) {
  if (!s->n) return 0;
  canonical(s);
  if (2 * (j->n + 1) > j->n_slots) {   /* grow and rehash */
    uint32_t ns = j->n_slots ? 2 * j->n_slots : 64;
    uint32_t *slots = calloc(ns, sizeof *slots);
    if (!slots) return 0;
    for (uint32_t id = 1; id < j->n; id++) {
      uint32_t k = set_hash(&j->sets[id]) & (ns - 1);
      while (slots[k]) k = (k + 1) & (ns - 1);
      slots[k] = id;
    }
    free(j->slots);
    j->slots = slots, j->n_slots = ns;
  }
  uint32_t k = set_hash(s) & (j->n_slots - 1);
  for (; j->slots[k]; k = (k + 1) & (j->n_slots - 1))
    if (!memcmp(&j->sets[j->slots[k]], s, sizeof *s)) return j->slots[k];
  if (j->n >= MAX_JSON_STATES) return 0;
  if (j->n == j->cap) {
    uint32_t cap = j->cap ? 2 * j->cap : 64;
    cset_t *sets = realloc(j->sets, cap * sizeof *sets);
    if (!sets) return 0;
    j->sets = sets, j->cap = cap;
  }
  j->sets[j->n] = *s;
  j->slots[k] = j->n;
  return j->n++;
}

static uint32_t js_start(constraint_t *c) {
  json_c *j = (json_c *)c;
  cset_t s;
  matcher_start(j->m, &s);
  return s.c[0].s ? intern(j, &s) : 0;
}
static uint32_t js_advance(constraint_t *c, uint32_t st, const uint8_t *b, uint32_t n) {
  json_c *j = (json_c *)c;
  if (!st) return 0;
  cset_t s = j->sets[st];
  return matcher_advance(j->m, &s, b, b ? n : 0) ? intern(j, &s) : 0;
}
static bool js_accepting(constraint_t *c, uint32_t st) {
  json_c *j = (json_c *)c;
  return st && matcher_accepting(j->m, &j->sets[st]);
}
static bool js_can_continue(constraint_t *c, uint32_t st) {   /* as the json controller's */
  json_c *j = (json_c *)c;
  cset_t t;
  for (int b = 0; st && b < 256; b++)
    if (matcher_step(j->m, &j->sets[st], (uint8_t)b, &t)) return true;
  return false;
}
static const aici_tokset_t *js_mask(constraint_t *c, uint32_t st) {
  json_c *j = (json_c *)c;
  if (st != j->mask_state) j->gen++, j->mask_state = st;
  return matcher_mask(j->m, j->trie, &j->sets[st], eos_token());
}
static uint32_t js_num_states(constraint_t *c) { return ((json_c *)c)->n; }
static const constraint_ops_t JSON_OPS = {js_start, js_advance, js_accepting, js_can_continue, js_mask, js_num_states};

static void json_finalizer(JSRuntime *r, JSValue v) {
  json_c *j = JS_GetOpaque(v, json_class);
  if (!j) return;   /* the matcher has no free: it lives in linear memory with the instance */
  free(j->sets);
  free(j->slots);
  free(j);
}

/* One option (a key of the options object or of the schema root's "x-aicirt"; the json
 * controller's names, and camelCase in JS). false: unknown or of the wrong type (thrown). */
static bool json_option(JSContext *c, json_opts_t *o, aici_buf_t *ignore, const jv_t *k, const jv_t *v) {
  bool truthy = v->kind == JV_TRUE || (v->kind == JV_NUM && v->num != 0);
  bool boolean = v->kind == JV_TRUE || v->kind == JV_FALSE || v->kind == JV_NUM;
  if (jv_str_is(k, "whitespace") && v->kind == JV_NUM && v->num >= 0 && v->num <= 1e6) {
    o->whitespace = (uint32_t)v->num;
  } else if ((jv_str_is(k, "anyOrder") || jv_str_is(k, "any_order")) && boolean) {
    o->any_order = truthy;
  } else if ((jv_str_is(k, "coerceOneOf") || jv_str_is(k, "coerce_one_of")) && boolean) {
    o->coerce_one_of = truthy;
  } else if (jv_str_is(k, "ignore") && (v->kind == JV_ARR || v->kind == JV_STR)) {
    for (uint32_t i = 0; i < (v->kind == JV_ARR ? v->n : 1); i++) {
      const jv_t *w = v->kind == JV_ARR ? &v->items[i] : v;
      if (w->kind != JV_STR) break;
      if (ignore->n) aici_buf_putc(ignore, ',');
      aici_buf_putn(ignore, w->s, w->n);
    }
  } else {
    JS_ThrowTypeError(c, "JsonSchema: option '%.*s' is unknown or of the wrong type (options: whitespace: number, "
                      "anyOrder: boolean, coerceOneOf: boolean, ignore: string[])", (int)k->n, k->s);
    return false;
  }
  return true;
}

static bool json_options(JSContext *c, const jv_t *obj, json_opts_t *o, aici_buf_t *ignore) {
  if (!obj) return true;
  if (obj->kind != JV_OBJ) { JS_ThrowTypeError(c, "JsonSchema: options (and x-aicirt) must be an object"); return false; }
  for (uint32_t i = 0; i < obj->n; i++)
    if (!json_option(c, o, ignore, &obj->keys[i], &obj->items[i])) return false;
  return true;
}

/* A JS value as a jv: a string is JSON text, anything else is JSON.stringify'd. NULL: thrown. */
static jv_t *to_jv(JSContext *c, JSValueConst v, const char *what) {
  JSValue text = JS_IsString(v) ? JS_DupValue(c, v) : JS_JSONStringify(c, v, JS_UNDEFINED, JS_UNDEFINED);
  if (JS_IsException(text)) return 0;
  size_t len;
  const char *s = JS_IsString(text) ? JS_ToCStringLen(c, &len, text) : 0;
  JS_FreeValue(c, text);
  if (!s) {
    if (!JS_HasException(c)) JS_ThrowTypeError(c, "JsonSchema: %s is not JSON", what);
    return 0;
  }
  const char *err = 0;
  uint32_t at = 0;
  jv_t *r = len < (1u << 30) ? jv_parse(s, (uint32_t)len, &err, &at) : 0;
  JS_FreeCString(c, s);
  if (!r) JS_ThrowSyntaxError(c, "JsonSchema: %s is not JSON: %s at offset %u", what, err ? err : "too large", at);
  return r;
}

/* The TypeError a schema the json compiler or matcher refused raises (`err`: its reason, freed). */
static JSValue schema_error(JSContext *c, char *err) {
  JSValue e = JS_ThrowTypeError(c, "JsonSchema: %s", err ? err : "cannot compile the schema");
  aici_free(err);
  return e;
}

static JSValue json_ctor(JSContext *c, JSValueConst new_target, int argc, JSValueConst *argv) {
  jv_t *schema = to_jv(c, argc ? argv[0] : JS_UNDEFINED, "the schema");
  if (!schema) return JS_EXCEPTION;
  jv_t *opts = argc > 1 && !JS_IsUndefined(argv[1]) ? to_jv(c, argv[1], "the options") : 0;
  if (argc > 1 && !JS_IsUndefined(argv[1]) && !opts) return JS_EXCEPTION;
  json_opts_t o = {0};
  aici_buf_t ignore = {0};
  if (!json_options(c, jv_get(schema, "x-aicirt"), &o, &ignore) || !json_options(c, opts, &o, &ignore))
    return JS_EXCEPTION;
  o.ignore = ignore.p;
  compiled_t comp = {0};
  char *err = 0;
  if (!schema_compile(schema, &o, &comp, &err)) return schema_error(c, err);
  if (comp.log.n) aici_logf("js: JsonSchema: %.*s", (int)comp.log.n, comp.log.p);
  matcher_t *m = matcher_new(&comp, &err);
  if (!m) return schema_error(c, err);
  const aici_trie_t *trie = get_trie(c);
  if (!trie) return JS_EXCEPTION;
  matcher_prepare(m, trie);   /* its tables before any fork: children find them in memory */
  JSValue obj = JS_NewObjectClass(c, (int)json_class);
  json_c *j = calloc(1, sizeof *j);
  if (JS_IsException(obj) || !j) { free(j); JS_FreeValue(c, obj); return JS_ThrowOutOfMemory(c); }
  j->base = (constraint_t){&JSON_OPS, &j->gen};
  j->m = m, j->trie = trie, j->n = 1;   /* id 0: dead */
  j->mask_state = UINT32_MAX;
  JS_SetOpaque(obj, j);
  if (!js_start(&j->base)) {
    JS_FreeValue(c, obj);
    return JS_ThrowTypeError(c, "JsonSchema: the schema admits no document");
  }
  return obj;
}

/* ---- the JS methods, shared by both ----------------------------------------------------------- */
static int state_arg(JSContext *c, JSValueConst this, JSValueConst v, constraint_t **k, uint32_t *st) {
  if (!(*k = constraint_of(c, this)) || check_uint(c, v, 4294967295.0, st, "state")) return -1;
  if (*st >= (*k)->ops->num_states(*k)) {
    JS_ThrowRangeError(c, "%u is not a state of this constraint", *st);
    return -1;
  }
  if ((*k)->ops == &GRAMMAR_OPS && *st && !gm_on_path((grammar_c *)*k, *st)) {
    JS_ThrowRangeError(c, "state %u is off the grammar's path (an advance from an earlier state replaced it)", *st);
    return -1;
  }
  return 0;
}

static JSValue c_start(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  constraint_t *k = constraint_of(c, this);
  return k ? JS_NewUint32(c, k->ops->start(k)) : JS_EXCEPTION;
}

/* advance(state, tokenOrTokens): the state after the tokens' bytes (0: dead). */
static JSValue c_advance(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  constraint_t *k;
  uint32_t st;
  if (state_arg(c, this, argc ? argv[0] : JS_UNDEFINED, &k, &st)) return JS_EXCEPTION;
  JSValueConst toks = argc > 1 ? argv[1] : JS_UNDEFINED;
  int64_t n = 1;
  bool many = JS_IsArray(toks);
  if (many && JS_GetLength(c, toks, &n) < 0) return JS_EXCEPTION;
  for (int64_t i = 0; i < n && st; i++) {
    uint32_t tok, len;
    JSValue v = many ? JS_GetPropertyInt64(c, toks, i) : JS_DupValue(c, toks);
    int bad = JS_IsException(v) || check_token(c, v, &tok, "advance: token");
    JS_FreeValue(c, v);
    if (bad) return JS_EXCEPTION;
    const uint8_t *b = aici_token_bytes(tok, &len);
    st = k->ops->advance(k, st, b, b ? len : 0);
  }
  return JS_NewUint32(c, st);
}

enum { C_ACCEPTING, C_CAN_CONTINUE };
static JSValue c_query(JSContext *c, JSValueConst this, int argc, JSValueConst *argv, int op) {
  constraint_t *k;
  uint32_t st;
  if (state_arg(c, this, argc ? argv[0] : JS_UNDEFINED, &k, &st)) return JS_EXCEPTION;
  if (!st) return JS_FALSE;
  return JS_NewBool(c, op == C_ACCEPTING ? k->ops->accepting(k, st) : k->ops->can_continue(k, st));
}

static JSValue mask_view(constraint_t *k, const aici_tokset_t *m) {
  return tokset_wrap((aici_tokset_t *)m, false, k->mask_gen, k->mask_gen ? *k->mask_gen : 0);
}

/* mask(state): the tokens that keep the text a prefix of the language, plus EOS where the state
 * accepts; read-only. */
static JSValue c_mask(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  constraint_t *k;
  uint32_t st;
  if (state_arg(c, this, argc ? argv[0] : JS_UNDEFINED, &k, &st)) return JS_EXCEPTION;
  if (!st) return tokset_wrap(aici_tokset_new(), true, 0, 0);
  return mask_view(k, k->ops->mask(k, st));
}

static const JSCFunctionListEntry constraint_proto[] = {
    JS_CFUNC_DEF("start", 0, c_start),
    JS_CFUNC_DEF("advance", 2, c_advance),
    JS_CFUNC_MAGIC_DEF("accepting", 1, c_query, C_ACCEPTING),
    JS_CFUNC_MAGIC_DEF("canContinue", 1, c_query, C_CAN_CONTINUE),
    JS_CFUNC_DEF("mask", 1, c_mask),
};

/* ---- native results ---------------------------------------------------------------------------- */
typedef struct {
  constraint_t *k;                    /* NULL: stop */
  const aici_tokset_t *mask;
  uint32_t gen;
} result_t;

static void result_finalizer(JSRuntime *r, JSValue v) { free(JS_GetOpaque(v, result_class)); }

static JSValue new_result(JSContext *c, constraint_t *k, const aici_tokset_t *mask) {
  JSValue obj = JS_NewObjectClass(c, (int)result_class);
  result_t *r = malloc(sizeof *r);
  if (JS_IsException(obj) || !r) { free(r); JS_FreeValue(c, obj); return JS_ThrowOutOfMemory(c); }
  *r = (result_t){k, mask, k && k->mask_gen ? *k->mask_gen : 0};
  JS_SetOpaque(obj, r);
  return obj;
}

static bool result_stale(const result_t *r) { return r->k && r->k->mask_gen && *r->k->mask_gen != r->gen; }

/* result.branches: the plain form ([] or [{sampleMask}]), for a script that looks into it. */
static JSValue result_branches(JSContext *c, JSValueConst this) {
  result_t *r = JS_GetOpaque2(c, this, result_class);
  if (!r) return JS_EXCEPTION;
  JSValue arr = JS_NewArray(c);
  if (r->k && !JS_IsException(arr)) {
    JSValue b = JS_NewObject(c);
    JS_SetPropertyStr(c, b, "sampleMask", tokset_wrap((aici_tokset_t *)r->mask, false, r->k->mask_gen, r->gen));
    JS_SetPropertyUint32(c, arr, 0, b);
  }
  return arr;
}

static const JSCFunctionListEntry result_proto[] = {
    JS_CGETSET_DEF("branches", result_branches, NULL),
};

int native_result(JSValueConst v, aici_result_t *res) {
  result_t *r = JS_GetOpaque(v, result_class);
  if (!r) return 0;
  if (result_stale(r)) {
    JS_ThrowTypeError(ctx, "midProcess returned a Follower result whose mask a later mask() replaced");
    return -1;
  }
  if (r->k) aici_sample(res, r->mask);
  return 1;
}

/* ---- Follower -------------------------------------------------------------------------------- */
typedef struct {
  JSValue cons;                       /* the constraint object (kept alive) */
  constraint_t *k;
  bool started;
  uint32_t prompt_len, n_seen, cap;
  uint32_t *toks, *states;            /* generated tokens followed; states[i]: after toks[0..i) */
} follower_t;

static void follower_finalizer(JSRuntime *r, JSValue v) {
  follower_t *f = JS_GetOpaque(v, follower_class);
  if (!f) return;
  JS_FreeValueRT(r, f->cons);
  free(f->toks);
  free(f->states);
  free(f);
}

static void follower_mark(JSRuntime *r, JSValueConst v, JS_MarkFunc *mark) {
  follower_t *f = JS_GetOpaque(v, follower_class);
  if (f) JS_MarkValue(r, f->cons, mark);
}

static JSValue follower_ctor(JSContext *c, JSValueConst new_target, int argc, JSValueConst *argv) {
  constraint_t *k = constraint_of(c, argc ? argv[0] : JS_UNDEFINED);
  if (!k) return JS_EXCEPTION;
  JSValue obj = JS_NewObjectClass(c, (int)follower_class);
  follower_t *f = calloc(1, sizeof *f);
  if (JS_IsException(obj) || !f) { free(f); JS_FreeValue(c, obj); return JS_ThrowOutOfMemory(c); }
  f->cons = JS_DupValue(c, argv[0]);
  f->k = k;
  JS_SetOpaque(obj, f);
  return obj;
}

static JSValue stop_with(JSContext *c, const char *why) {
  if (why) aici_logf("js: Follower: %s\n", why);
  return new_result(c, 0, 0);
}

/* step(): this call's result under the constraint — the C regex/json controllers' rule: the
 * prompt is what the sequence held at the first step(); stop on EOS sampled, on a dead state and
 * on a complete match that cannot continue; else sample under the state's mask. */
static JSValue follower_step(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  follower_t *f = JS_GetOpaque2(c, this, follower_class);
  if (!f) return JS_EXCEPTION;
  const aici_arg_t *a = cur_arg;
  if (!a) return JS_ThrowTypeError(c, "Follower.step() is available during midProcess only");
  constraint_t *k = f->k;
  if (!f->started) {
    f->started = true;
    f->prompt_len = a->n_all_tokens;
    f->cap = 64;
    f->toks = malloc(f->cap * 4), f->states = malloc((f->cap + 1) * 4);
    if (!f->toks || !f->states) return JS_ThrowOutOfMemory(c);
    f->states[0] = k->ops->start(k);
    f->n_seen = 0;
  }
  if (a->n_all_tokens < f->prompt_len) return stop_with(c, "backtracked into the prompt");
  if (a->has_sampled && a->sampled == aici_eos_token()) return stop_with(c, 0);   /* EOS while accepting */
  uint32_t gen = a->n_all_tokens - f->prompt_len, keep = f->n_seen < gen ? f->n_seen : gen;
  const aici_token_t *now = a->all_tokens + f->prompt_len;
  if (memcmp(f->toks, now, keep * 4)) {   /* backtracked (since any earlier call): the common prefix */
    uint32_t i = 0;
    while (i < keep && f->toks[i] == now[i]) i++;
    keep = i;
  }
  if (gen > f->cap) {
    uint32_t cap = f->cap;
    while (cap < gen) cap *= 2;
    uint32_t *t = realloc(f->toks, cap * 4), *s = t ? realloc(f->states, (cap + 1) * 4) : 0;
    if (t) f->toks = t;
    if (!s) return JS_ThrowOutOfMemory(c);
    f->states = s, f->cap = cap;
  }
  for (uint32_t i = keep; i < gen; i++) {
    uint32_t len;
    const uint8_t *b = aici_token_bytes(now[i], &len);
    f->toks[i] = now[i];
    f->states[i + 1] = f->states[i] ? k->ops->advance(k, f->states[i], b, b ? len : 0) : 0;
  }
  f->n_seen = gen;
  uint32_t st = f->states[gen];
  if (!st) return stop_with(c, "the text no longer matches");
  bool accepting = k->ops->accepting(k, st);
  if (accepting && !k->ops->can_continue(k, st)) return stop_with(c, 0);   /* complete: stop */
  const aici_tokset_t *m = k->ops->mask(k, st);
  if (!accepting && aici_tokset_empty(m)) return stop_with(c, "no token can continue the match");
  return new_result(c, k, m);
}

/* follower.state: the constraint's state after the generated tokens (as of the last step()). */
static JSValue follower_state(JSContext *c, JSValueConst this) {
  follower_t *f = JS_GetOpaque2(c, this, follower_class);
  if (!f) return JS_EXCEPTION;
  return JS_NewUint32(c, f->started ? f->states[f->n_seen] : f->k->ops->start(f->k));
}

static const JSCFunctionListEntry follower_proto[] = {
    JS_CFUNC_DEF("step", 0, follower_step),
    JS_CGETSET_DEF("state", follower_state, NULL),
};

void constraint_define(JSValueConst api) {
  static JSClassDef re = {"Regex", .finalizer = regex_finalizer}, js = {"JsonSchema", .finalizer = json_finalizer},
                    gm = {"Grammar", .finalizer = grammar_finalizer},
                    fo = {"Follower", .finalizer = follower_finalizer, .gc_mark = follower_mark},
                    rs = {"FollowerResult", .finalizer = result_finalizer};
  int nc = sizeof constraint_proto / sizeof constraint_proto[0];
  define_class(api, &regex_class, &re, regex_ctor, constraint_proto, nc);
  define_class(api, &json_class, &js, json_ctor, constraint_proto, nc);
  define_class(api, &grammar_class, &gm, grammar_ctor, constraint_proto, nc);
  define_class(api, &follower_class, &fo, follower_ctor, follower_proto, sizeof follower_proto / sizeof follower_proto[0]);
  define_class(api, &result_class, &rs, 0, result_proto, 1);
  JS_SetPropertyStr(ctx, api, "choice", JS_NewCFunction(ctx, choice_fn, "choice", 1));
}
