/* TokenSet: a native bitset over the vocabulary (the SDK's aici_tokset_t), handed to the host
 * without a copy. A constraint's mask is a read-only view: a Regex's is cached for good, a
 * JsonSchema's is valid until that schema's next mask (a stale view throws, naming copy()). */
#include <stdio.h>
#include <stdlib.h>

#include "js.h"

JSClassID tokset_class;

static void tokset_finalizer(JSRuntime *r, JSValue v) {
  tokset_t *t = JS_GetOpaque(v, tokset_class);
  if (!t) return;
  if (t->owned) aici_tokset_free(t->set);
  free(t);
}

JSValue tokset_wrap(aici_tokset_t *set, bool owned, const uint32_t *gen_ptr, uint32_t gen) {
  JSValue obj = JS_NewObjectClass(ctx, (int)tokset_class);
  if (JS_IsException(obj)) return obj;
  tokset_t *t = malloc(sizeof *t);
  if (!t) {
    JS_FreeValue(ctx, obj);
    return JS_ThrowOutOfMemory(ctx);
  }
  *t = (tokset_t){set, owned, gen_ptr, gen};
  JS_SetOpaque(obj, t);
  return obj;
}

tokset_t *tokset_of(JSContext *c, JSValueConst v) {
  tokset_t *t = JS_GetOpaque2(c, v, tokset_class);
  if (t && t->gen_ptr && *t->gen_ptr != t->gen) {
    JS_ThrowTypeError(c, "this TokenSet was a JsonSchema's mask, replaced by a later mask(): copy() a mask to keep it");
    return 0;
  }
  return t;
}

static tokset_t *tokset_mut(JSContext *c, JSValueConst v) {
  tokset_t *t = tokset_of(c, v);
  if (t && !t->owned) {
    JS_ThrowTypeError(c, "this TokenSet is a constraint's mask and read-only: copy() it first");
    return 0;
  }
  return t;
}

static JSValue tokset_ctor(JSContext *c, JSValueConst new_target, int argc, JSValueConst *argv) {
  JSValue obj = tokset_wrap(aici_tokset_new(), true, 0, 0);
  if (JS_IsException(obj)) return obj;
  if (argc > 0 && !JS_IsUndefined(argv[0])) {   /* new TokenSet(iterable of token ids) */
    tokset_t *t = tokset_of(c, obj);
    int64_t n;
    if (JS_GetLength(c, argv[0], &n) < 0) { JS_FreeValue(c, obj); return JS_EXCEPTION; }
    for (int64_t i = 0; i < n; i++) {
      uint32_t tok;
      char where[48];
      snprintf(where, sizeof where, "TokenSet: tokens[%lld]", (long long)i);
      JSValue v = JS_GetPropertyInt64(c, argv[0], i);
      int bad = JS_IsException(v) || check_uint(c, v, (double)t->set->vocab - 1, &tok, where);
      JS_FreeValue(c, v);
      if (bad) { JS_FreeValue(c, obj); return JS_EXCEPTION; }
      aici_tokset_allow(t->set, tok);
    }
  }
  return obj;
}

static int arg_token(JSContext *c, tokset_t *t, JSValueConst v, uint32_t *tok, bool upto) {
  return check_uint(c, v, (double)t->set->vocab - (upto ? 0 : 1), tok, upto ? "TokenSet range bound" : "TokenSet token");
}

enum { TS_ALLOW, TS_DENY, TS_HAS };
static JSValue tokset_one(JSContext *c, JSValueConst this, int argc, JSValueConst *argv, int op) {
  tokset_t *t = op == TS_HAS ? tokset_of(c, this) : tokset_mut(c, this);
  uint32_t tok;
  if (!t || arg_token(c, t, argc ? argv[0] : JS_UNDEFINED, &tok, false)) return JS_EXCEPTION;
  if (op == TS_HAS) return JS_NewBool(c, aici_tokset_has(t->set, tok));
  if (op == TS_ALLOW) aici_tokset_allow(t->set, tok); else aici_tokset_deny(t->set, tok);
  return JS_DupValue(c, this);
}

static JSValue tokset_range(JSContext *c, JSValueConst this, int argc, JSValueConst *argv, int deny) {
  tokset_t *t = tokset_mut(c, this);
  uint32_t lo, hi;
  if (!t || arg_token(c, t, argc > 0 ? argv[0] : JS_UNDEFINED, &lo, true) ||
      arg_token(c, t, argc > 1 ? argv[1] : JS_UNDEFINED, &hi, true))
    return JS_EXCEPTION;
  if (deny) aici_tokset_deny_range(t->set, lo, hi); else aici_tokset_allow_range(t->set, lo, hi);
  return JS_DupValue(c, this);
}

enum { TS_CLEAR, TS_FILL };
static JSValue tokset_whole(JSContext *c, JSValueConst this, int argc, JSValueConst *argv, int op) {
  tokset_t *t = tokset_mut(c, this);
  if (!t) return JS_EXCEPTION;
  if (op == TS_FILL) aici_tokset_fill(t->set); else aici_tokset_clear(t->set);
  return JS_DupValue(c, this);
}

enum { TS_AND, TS_OR, TS_SUB, TS_SET };
static JSValue tokset_bin(JSContext *c, JSValueConst this, int argc, JSValueConst *argv, int op) {
  tokset_t *t = tokset_mut(c, this), *o = t ? tokset_of(c, argc ? argv[0] : JS_UNDEFINED) : 0;
  if (!t || !o) return JS_EXCEPTION;
  if (op == TS_AND) aici_tokset_and(t->set, o->set);
  else if (op == TS_OR) aici_tokset_or(t->set, o->set);
  else if (op == TS_SUB) aici_tokset_sub(t->set, o->set);
  else aici_tokset_copy(t->set, o->set);
  return JS_DupValue(c, this);
}

static JSValue tokset_copy(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  tokset_t *t = tokset_of(c, this);
  if (!t) return JS_EXCEPTION;
  aici_tokset_t *s = aici_tokset_new();
  aici_tokset_copy(s, t->set);
  return tokset_wrap(s, true, 0, 0);
}

enum { TS_COUNT, TS_EMPTY, TS_SIZE };
static JSValue tokset_query(JSContext *c, JSValueConst this, int argc, JSValueConst *argv, int op) {
  tokset_t *t = tokset_of(c, this);
  if (!t) return JS_EXCEPTION;
  if (op == TS_EMPTY) return JS_NewBool(c, aici_tokset_empty(t->set));
  return JS_NewUint32(c, op == TS_COUNT ? aici_tokset_count(t->set) : t->set->vocab);
}

static JSValue tokset_tokens(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  tokset_t *t = tokset_of(c, this);
  if (!t) return JS_EXCEPTION;
  JSValue arr = JS_NewArray(c);
  uint32_t k = 0;
  for (uint32_t w = 0; w < t->set->n_words; w++)
    for (uint32_t bits = t->set->words[w]; bits; bits &= bits - 1) {
      uint32_t tok = w * 32 + (uint32_t)__builtin_ctz(bits);
      if (tok < t->set->vocab) JS_SetPropertyUint32(c, arr, k++, JS_NewUint32(c, tok));
    }
  return arr;
}

static const JSCFunctionListEntry tokset_proto[] = {
    JS_CFUNC_MAGIC_DEF("allow", 1, tokset_one, TS_ALLOW),
    JS_CFUNC_MAGIC_DEF("deny", 1, tokset_one, TS_DENY),
    JS_CFUNC_MAGIC_DEF("has", 1, tokset_one, TS_HAS),
    JS_CFUNC_MAGIC_DEF("allowRange", 2, tokset_range, 0),
    JS_CFUNC_MAGIC_DEF("denyRange", 2, tokset_range, 1),
    JS_CFUNC_MAGIC_DEF("clear", 0, tokset_whole, TS_CLEAR),
    JS_CFUNC_MAGIC_DEF("fill", 0, tokset_whole, TS_FILL),
    JS_CFUNC_MAGIC_DEF("and", 1, tokset_bin, TS_AND),
    JS_CFUNC_MAGIC_DEF("or", 1, tokset_bin, TS_OR),
    JS_CFUNC_MAGIC_DEF("sub", 1, tokset_bin, TS_SUB),
    JS_CFUNC_MAGIC_DEF("set", 1, tokset_bin, TS_SET),
    JS_CFUNC_DEF("copy", 0, tokset_copy),
    JS_CFUNC_MAGIC_DEF("count", 0, tokset_query, TS_COUNT),
    JS_CFUNC_MAGIC_DEF("isEmpty", 0, tokset_query, TS_EMPTY),
    JS_CFUNC_MAGIC_DEF("size", 0, tokset_query, TS_SIZE),
    JS_CFUNC_DEF("tokens", 0, tokset_tokens),
};

void tokset_define(JSValueConst api) {
  static JSClassDef def = {"TokenSet", .finalizer = tokset_finalizer};
  define_class(api, &tokset_class, &def, tokset_ctor, tokset_proto,
               sizeof tokset_proto / sizeof tokset_proto[0]);
}
