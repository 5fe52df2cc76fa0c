/* Internal header of the js controller: what the glue's files share (docs/js.md).
 *
 * main.c: the interpreter, the host API, one step and the result conversion; tokset.c: the
 * TokenSet class; constraint.c: the native constraints (Regex, JsonSchema) and Follower, which
 * runs a constraint over the generated tokens without per-token JS. */
#ifndef JS_CTRL_H
#define JS_CTRL_H
#include <stdbool.h>
#include <stdint.h>

#include "aici.h"
#include "quickjs.h"

extern JSContext *ctx;
extern const aici_arg_t *cur_arg;     /* the running mid-process call's argument (NULL between calls) */

/* ---- TokenSet (tokset.c) ------------------------------------------------------------------ */
extern JSClassID tokset_class;
typedef struct {
  aici_tokset_t *set;
  bool owned;                         /* false: a constraint's mask, read-only */
  const uint32_t *gen_ptr;            /* a view valid while *gen_ptr == gen (NULL: always) */
  uint32_t gen;
} tokset_t;
/* A TokenSet object for `set`; owned: freed with the object. NULL gen_ptr: valid for good. */
JSValue tokset_wrap(aici_tokset_t *set, bool owned, const uint32_t *gen_ptr, uint32_t gen);
/* The set of a TokenSet value (NULL with a TypeError pending), stale views refused. */
tokset_t *tokset_of(JSContext *c, JSValueConst v);
void tokset_define(JSValueConst api);

/* ---- constraints (constraint.c) ----------------------------------------------------------- */
void constraint_define(JSValueConst api);
/* A native result (Follower.step) converted straight into `res`: 1 done, 0 not one, -1 error. */
int native_result(JSValueConst r, aici_result_t *res);

/* ---- the interpreter's heap (alloc.c) ----------------------------------------------------- */
#define JS_HEAP_LIMIT (40u << 20)     /* of the instance's 64 MiB: a bomb fails in JS, not in malloc */
#define JS_HEAP_SOFT (JS_HEAP_LIMIT - (1u << 20))   /* where allocations fail first; the rest a reserve */
#define JS_HEAP_GRANT (128u << 10)    /* what each failure grants of the reserve: the error, the catch */
extern const JSMallocFunctions js_heap_funcs;

/* ---- shared helpers (main.c) -------------------------------------------------------------- */
const aici_trie_t *get_trie(JSContext *c);   /* NULL with an exception pending */
/* A JS array of token ids -> a malloc'd array; NULL with an exception pending. */
uint32_t *tokens_from(JSContext *c, JSValueConst v, uint32_t *n_out, const char *what);
JSValue tokens_array(JSContext *c, const uint32_t *t, uint32_t n);
/* v, an exact integer in [0, max] -> *out; else -1 with a TypeError (not a number) or RangeError
 * (a fraction, NaN, an infinity, out of range) naming `what` and the value: nothing is coerced. */
int check_uint(JSContext *c, JSValueConst v, double max, uint32_t *out, const char *what);
/* check_uint for a token id: below aici_vocab_size(). */
int check_token(JSContext *c, JSValueConst v, uint32_t *out, const char *what);
/* A class with constructor `ctor` and prototype methods `fns`, as api[name]. */
/* A class `def` with prototype methods `fns` and, unless `ctor` is NULL, api[def->class_name] its
 * constructor. */
void define_class(JSValueConst api, JSClassID *id, const JSClassDef *def, JSCFunction *ctor,
                  const JSCFunctionListEntry *fns, int n_fns);

#endif
