/* js: controllers written in JavaScript, run by QuickJS-NG inside this controller (docs/js.md).
 *
 * The controller's argument is the script, optionally followed by a NUL byte and the script's
 * own argument (`aici.arg()`). The script defines `midProcess(arg)`; every mid-process call
 * passes it the WIT's `mid-process-arg` (camelCase, plus `callIndex`) and turns what it returns,
 * shaped like the WIT's `mid-process-result`, into the result. The API (`aici`, aici.d.ts)
 * mirrors the WIT host interface; token sets and the constraints (Regex, JsonSchema, Follower:
 * constraint.c) are native, so a JS controller's masks cost what C's do. A script bound to the
 * module (`aicirt upload ctrl.js`, runtime/loader/js_bind.py) reaches it the same way: the runtime puts
 * the script and its NUL in front of every request's argument.
 *
 * Lifetimes: the interpreter, its context and the API are made by `aicirt_init`, once per
 * (controller, tokenizer), and kept in the init snapshot (docs/snapshots.md); the script is
 * evaluated on the request's first call; a fork copies the pages of the interpreter the parent
 * wrote. A host without snapshots makes the interpreter on the first call instead.
 *
 * Errors never trap silently: a syntax error, an exception, or a result of the wrong shape is
 * written to the log (message and stack) and ends the sequence through WASI `proc_exit(1)`,
 * whose error the runtime words from that log line (docs/wasi.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "js.h"

#define JS_STACK_LIMIT (128u << 10)   /* of the 1 MiB shadow stack: QuickJS's check must fire before the
                                     * Wasm stack (wasmtime's 512 KiB) runs out: ~400 plain JS frames */
#define MAX_LOG_CHARS (16u << 10)     /* one console.log line; longer ones are cut */

__attribute__((import_module("wasi_snapshot_preview1"), import_name("proc_exit"), noreturn))
void wasi_proc_exit(int32_t code);

static JSRuntime *rt;
JSContext *ctx;
const aici_arg_t *cur_arg;
static JSValue mid_fn;                /* the script's midProcess */
static const aici_trie_t *trie;
static bool script_loaded;
static bool in_init;                  /* evaluating a bound script in the per-tokenizer init */
/* Property names used every step, interned once (by the init): no string hashing per step. */
enum { A_BRANCHES, A_SAMPLE_MASK, A_TEMPERATURE, A_SPLICES, A_WHEN_SAMPLED, A_BACKTRACK, A_FF_TOKENS,
       A_TOKENS, A_SAMPLED, A_FORK_GROUP, A_CALL_INDEX, N_ATOMS };
static const char *const ATOM_NAMES[N_ATOMS] = {"branches", "sampleMask", "temperature", "splices", "whenSampled",
                                                "backtrack", "ffTokens", "tokens", "sampled", "forkGroup", "callIndex"};
static JSAtom atoms[N_ATOMS];
static uint32_t arg_skip;             /* bytes of aici_arg() before the script's own argument */

/* What runtime/loader/js_bind.py looks for before it binds a script to a module: this is the js
 * controller. */
__attribute__((used)) static const char JS_CONTROLLER_MARKER[] = "aicirt:js:controller:1";

static const char *type_name(JSValueConst v);

/* The host's time notice (docs/protocol.md#limits; exported by build.json's "exports"): set to 1
 * when the call's time is nearly up. QuickJS polls it (every 10,000 interpreter steps and in
 * regex matching) and throws its uncatchable "interrupted", so a time-out names the JS frames where
 * the script was; cleared at every call. Native work (a mask, a big compile) does not poll: the
 * host's own limit ends that. */
volatile uint32_t aicirt_time_notice;
static int on_interrupt(JSRuntime *r, void *opaque) { return aicirt_time_notice != 0; }

/* ---- failing: the log, then proc_exit ----------------------------------------------------- */
__attribute__((noreturn)) static void die(const char *what, const char *text, size_t len) {
  aici_logf("js: %s: %.*s\n", what, (int)len, text);
  wasi_proc_exit(1);
}

/* The pending exception as "Name: message\n    at ..." (its stack when it has one). */
__attribute__((noreturn)) static void die_exception(const char *what) {
  JSValue exc = JS_GetException(ctx);
  if (aicirt_time_notice && JS_IsUncatchableError(exc)) what = "the call's time limit interrupted the script";
  const char *msg = JS_IsSymbol(exc) ? 0 : JS_ToCString(ctx, exc);
  if (!msg) {   /* a Symbol, or a value whose conversion to a string threw: say which, truthfully */
    JS_FreeValue(ctx, JS_GetException(ctx));
    char buf[256];
    if (JS_IsSymbol(exc)) {
      JSValue d = JS_GetPropertyStr(ctx, exc, "description");
      const char *ds = JS_IsString(d) ? JS_ToCString(ctx, d) : 0;
      snprintf(buf, sizeof buf, "a thrown Symbol(%.200s)", ds ? ds : "");
      JS_FreeCString(ctx, ds);
      JS_FreeValue(ctx, d);
    } else {
      snprintf(buf, sizeof buf, "a thrown value (%s%s) whose conversion to a string threw", JS_IsProxy(exc) ? "a Proxy of " : "",
               type_name(exc));
    }
    die(what, buf, strlen(buf));
  }
  char *text = 0;
  size_t len = strlen(msg);
  if (JS_IsError(exc)) {
    JSValue stack = JS_GetPropertyStr(ctx, exc, "stack");
    const char *st = JS_IsString(stack) ? JS_ToCString(ctx, stack) : 0;
    if (st && *st) {
      size_t sl = strlen(st);
      text = malloc(len + 1 + sl + 1);
      if (text) {
        memcpy(text, msg, len);
        text[len] = '\n';
        memcpy(text + len + 1, st, sl);
        len += 1 + sl;
        while (len && text[len - 1] == '\n') len--;
      }
    }
  }
  die(what, text ? text : msg, text ? len : strlen(msg));
}

static JSValue throw_shape(const char *path, const char *expected) {
  return JS_ThrowTypeError(ctx, "midProcess returned a result of the wrong shape: %s %s", path, expected);
}

const aici_trie_t *get_trie(JSContext *c) {
  if (!trie && !(trie = aici_trie())) JS_ThrowInternalError(c, "the host's token trie is invalid");
  else aici_token_bytes(0, 0);
  return trie;
}

void define_class(JSValueConst api, JSClassID *id, const JSClassDef *def, JSCFunction *ctor,
                  const JSCFunctionListEntry *fns, int n_fns) {
  JS_NewClassID(rt, id);
  JS_NewClass(rt, *id, def);
  JSValue proto = JS_NewObject(ctx);
  JS_SetPropertyFunctionList(ctx, proto, fns, n_fns);
  if (ctor) {
    JSValue f = JS_NewCFunction2(ctx, ctor, def->class_name, 1, JS_CFUNC_constructor, 0);
    JS_SetConstructor(ctx, f, proto);
    JS_SetPropertyStr(ctx, api, def->class_name, f);
  }
  JS_SetClassProto(ctx, *id, proto);
}

/* ---- the host interface -------------------------------------------------------------------- */
JSValue tokens_array(JSContext *c, const uint32_t *t, uint32_t n) {
  JSValue arr = JS_NewArray(c);
  if (JS_IsException(arr)) return arr;
  for (uint32_t i = 0; i < n; i++) JS_SetPropertyUint32(c, arr, i, JS_NewUint32(c, t[i]));
  return arr;
}

static const char *type_name(JSValueConst v) {
  return JS_IsString(v) ? "a string" : JS_IsUndefined(v) ? "undefined" : JS_IsNull(v) ? "null"
       : JS_IsBool(v) ? "a boolean" : JS_IsSymbol(v) ? "a Symbol" : JS_IsBigInt(v) ? "a BigInt"
       : JS_IsFunction(ctx, v) ? "a function" : JS_IsArray(v) ? "an array" : JS_IsObject(v) ? "an object" : "a value";
}

int check_uint(JSContext *c, JSValueConst v, double max, uint32_t *out, const char *what) {
  if (!JS_IsNumber(v)) { JS_ThrowTypeError(c, "%s: expected an integer from 0 to %.0f, got %s", what, max, type_name(v)); return -1; }
  double d;
  JS_ToFloat64(c, &d, v);
  if (d != d || d < 0 || d > max || d != (double)(uint64_t)d) {
    const char *s = JS_ToCString(c, v);   /* JS's own spelling: NaN, Infinity, 65.5, 4294967297 */
    JS_ThrowRangeError(c, "%s: %s is not an integer from 0 to %.0f", what, s ? s : "?", max);
    JS_FreeCString(c, s);
    return -1;
  }
  *out = (uint32_t)d;
  return 0;
}

int check_token(JSContext *c, JSValueConst v, uint32_t *out, const char *what) {
  return check_uint(c, v, (double)aici_vocab_size() - 1, out, what);
}

/* A JS array of token ids -> a heap array (free with free); NULL with an exception pending. */
uint32_t *tokens_from(JSContext *c, JSValueConst v, uint32_t *n_out, const char *what) {
  int64_t n;
  if (!JS_IsArray(v)) { JS_ThrowTypeError(c, "%s: expected an array of token ids", what); return 0; }
  if (JS_GetLength(c, v, &n) < 0) return 0;
  if (n > (1 << 24)) { JS_ThrowRangeError(c, "%s: %lld tokens is too many", what, (long long)n); return 0; }
  uint32_t *t = malloc((size_t)(n ? n : 1) * 4), vocab = aici_vocab_size();
  if (!t) { JS_ThrowOutOfMemory(c); return 0; }
  char where[128];
  for (int64_t i = 0; i < n; i++) {
    JSValue e = JS_GetPropertyInt64(c, v, i);
    snprintf(where, sizeof where, "%s[%lld]", what, (long long)i);
    int bad = JS_IsException(e) || check_uint(c, e, (double)vocab - 1, &t[i], where);
    JS_FreeValue(c, e);
    if (bad) {
      free(t);
      return 0;
    }
  }
  *n_out = (uint32_t)n;
  return t;
}

static JSValue api_vocab_size(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) { return JS_NewUint32(c, aici_vocab_size()); }
static JSValue api_eos_token(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) { return JS_NewUint32(c, aici_eos_token()); }
static JSValue api_self_seq_id(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) { return JS_NewUint32(c, aici_self_seq_id()); }
static JSValue api_capabilities(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) { return JS_NewUint32(c, aici_capabilities()); }

static JSValue api_tokenize(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  size_t len;
  const char *s = JS_ToCStringLen(c, &len, argc ? argv[0] : JS_UNDEFINED);
  if (!s) return JS_EXCEPTION;
  uint32_t n;
  aici_token_t *t = aici_tokenize(s, len, &n);
  JS_FreeCString(c, s);
  JSValue arr = tokens_array(c, t, n);
  aici_free(t);
  return arr;
}

static JSValue api_detokenize(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  uint32_t n, len;
  uint32_t *t = tokens_from(c, argc ? argv[0] : JS_UNDEFINED, &n, "detokenize");
  if (!t) return JS_EXCEPTION;
  uint8_t *b = aici_detokenize(t, n, &len);
  free(t);
  JSValue s = JS_NewStringLen(c, (const char *)b, len);   /* invalid UTF-8 -> U+FFFD */
  aici_free(b);
  return s;
}

static JSValue api_token_bytes(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  uint32_t tok, len;
  if (check_token(c, argc ? argv[0] : JS_UNDEFINED, &tok, "tokenBytes")) return JS_EXCEPTION;
  if (!get_trie(c)) return JS_EXCEPTION;
  const uint8_t *b = aici_token_bytes(tok, &len);
  return b ? JS_NewUint8ArrayCopy(c, b, len) : JS_NULL;
}

static JSValue api_arg(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  if (in_init) return JS_ThrowTypeError(c, "aici.arg() is the request's: this bound script's top level runs in the "
                                           "per-tokenizer init (it calls aici.init); call it from midProcess");
  uint32_t n;
  char *a = (char *)aici_arg(&n);
  JSValue s = arg_skip < n ? JS_NewStringLen(c, a + arg_skip, n - arg_skip) : JS_NewString(c, "");
  aici_free(a);
  return s;
}

static JSValue api_var_get(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  const char *name = JS_ToCString(c, argc ? argv[0] : JS_UNDEFINED);
  if (!name) return JS_EXCEPTION;
  uint32_t len;
  uint8_t *v = aici_var_get(name, &len);
  JS_FreeCString(c, name);
  if (!v) return JS_UNDEFINED;
  JSValue s = JS_NewStringLen(c, (const char *)v, len);
  aici_free(v);
  return s;
}

static JSValue api_var_set(JSContext *c, JSValueConst this, int argc, JSValueConst *argv, int append) {
  size_t vlen;
  const char *name = JS_ToCString(c, argc ? argv[0] : JS_UNDEFINED);
  if (!name) return JS_EXCEPTION;
  const char *val = JS_ToCStringLen(c, &vlen, argc > 1 ? argv[1] : JS_UNDEFINED);
  if (!val) { JS_FreeCString(c, name); return JS_EXCEPTION; }
  if (append) aici_var_append(name, val, vlen); else aici_var_set(name, val, vlen);
  JS_FreeCString(c, name);
  JS_FreeCString(c, val);
  return JS_UNDEFINED;
}

/* log(...values): one line, the values as strings joined by spaces (cut at MAX_LOG_CHARS). */
static JSValue api_log(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  for (int i = 0; i < argc; i++) {
    size_t len;
    const char *s = JS_ToCStringLen(c, &len, argv[i]);
    if (!s) return JS_EXCEPTION;
    if (i) aici_log(" ", 1);
    if (len > MAX_LOG_CHARS) {
      aici_log(s, MAX_LOG_CHARS);
      aici_logf("...(%zu bytes cut)", len - MAX_LOG_CHARS);
    } else {
      aici_log(s, len);
    }
    JS_FreeCString(c, s);
  }
  aici_log("\n", 1);
  return JS_UNDEFINED;
}

static JSValue api_all_tokens(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  if (!cur_arg) return JS_ThrowTypeError(c, "allTokens() is available during midProcess only");
  return tokens_array(c, cur_arg->all_tokens, cur_arg->n_all_tokens);
}

static const JSCFunctionListEntry api_funcs[] = {
    JS_CFUNC_DEF("vocabSize", 0, api_vocab_size),
    JS_CFUNC_DEF("eosToken", 0, api_eos_token),
    JS_CFUNC_DEF("selfSeqId", 0, api_self_seq_id),
    JS_CFUNC_DEF("capabilities", 0, api_capabilities),
    JS_CFUNC_DEF("tokenize", 1, api_tokenize),
    JS_CFUNC_DEF("detokenize", 1, api_detokenize),
    JS_CFUNC_DEF("tokenBytes", 1, api_token_bytes),
    JS_CFUNC_DEF("arg", 0, api_arg),
    JS_CFUNC_DEF("varGet", 1, api_var_get),
    JS_CFUNC_MAGIC_DEF("varSet", 2, api_var_set, 0),
    JS_CFUNC_MAGIC_DEF("varAppend", 2, api_var_set, 1),
    JS_CFUNC_DEF("log", 1, api_log),
    JS_CFUNC_DEF("allTokens", 0, api_all_tokens),
};

/* Helpers written in JS (part of the init snapshot). */
static const char PRELUDE[] =
    "'use strict';\n"
    "aici.Cap = Object.freeze({FORK: 1, BACKTRACK: 2, FF_TOKENS: 4, CONDITIONAL_FF_TOKENS: 8});\n"
    "aici.stop = () => ({branches: []});\n"
    "aici.sample = (mask, opts) => ({branches: [opts ? Object.assign({sampleMask: mask}, opts) : {sampleMask: mask}]});\n"
    "aici.fastForward = (tokens, backtrack) => ({branches: [{splices: [{backtrack: backtrack === undefined ? 0 : backtrack, ffTokens: tokens}]}]});\n"
    "aici.noop = () => aici.fastForward([], 0);\n"
    "globalThis.console = Object.freeze({log: aici.log, info: aici.log, warn: aici.log, error: aici.log, debug: aici.log});\n";

/* The async library (lib.js: start, $, gen, fork, waitVars, Label, ...), part of the snapshot. */
static const char LIB[] = {
#embed "lib.js"
};

/* What `import ... from "aici"` gives a module script: the library and the API as named exports. */
static const char LIB_MODULE[] =
    "const a = globalThis.aici;\n"
    "export default a;\n"
    "export const {start, init, $, fixed, gen, fork, waitVars, Label, getPrompt, getTokens, setVar, getVar, appendVar,\n"
    "  TokenSet, Regex, JsonSchema, Grammar, Follower, choice, Cap, stop, sample, fastForward, noop, vocabSize, eosToken,\n"
    "  selfSeqId, capabilities, tokenize, detokenize, tokenBytes, arg, allTokens, varGet, varSet, varAppend, log} = a;\n";

/* The cycle collector's next run: GC_HEADROOM past the heap as it is now. QuickJS frees most
 * garbage by reference counting; its cycle collector walks every object of the heap, writing
 * each header, and its first threshold (256 KiB) lies below the heap the init leaves, so the
 * first allocation of every request would walk (and so copy-on-write, and make each fork copy)
 * the whole snapshot heap. */
#define GC_HEADROOM (8u << 20)
static void gc_later(void) {
  JSMemoryUsage u;
  JS_ComputeMemoryUsage(rt, &u);
  JS_SetGCThreshold(rt, (size_t)u.malloc_size + GC_HEADROOM);
}

static bool is_module(const char *s, uint32_t n);
static void load_script(void);

/* aici._checkSyntax(source): compile `source` as the controller would (a module when a line starts
 * with import/export), run nothing; a SyntaxError names <script>:LINE:COL. For `aicirt build`
 * (runtime/loader/js_bind.py); harmless to scripts, which can eval anyway. */
static JSValue api_check_syntax(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  if (!argc || !JS_IsString(argv[0])) return JS_ThrowTypeError(c, "_checkSyntax: expected a string");
  size_t len;
  const char *src = JS_ToCStringLen(c, &len, argv[0]);
  if (!src) return JS_EXCEPTION;
  bool module = is_module(src, (uint32_t)len);
  JSValue f = JS_Eval(c, src, len, "<script>", (module ? JS_EVAL_TYPE_MODULE : JS_EVAL_TYPE_GLOBAL) | JS_EVAL_FLAG_COMPILE_ONLY);
  JS_FreeCString(c, src);
  if (JS_IsException(f)) return f;
  JS_FreeValue(c, f);
  return JS_NewBool(c, module);
}

/* ---- modules and jobs ---------------------------------------------------------------------- */
/* `import` in a module script: "aici" (or "@aicirt/aici") is the shipped library; nothing else
 * exists (no files, no network). */
static JSModuleDef *load_module(JSContext *c, const char *name, void *opaque) {
  if (strcmp(name, "aici") && strcmp(name, "@aicirt/aici")) {
    JS_ThrowReferenceError(c, "cannot import '%s': the only module is \"aici\" (the shipped library)", name);
    return 0;
  }
  JSValue f = JS_Eval(c, LIB_MODULE, sizeof LIB_MODULE - 1, name, JS_EVAL_TYPE_MODULE | JS_EVAL_FLAG_COMPILE_ONLY);
  if (JS_IsException(f)) return 0;
  JSModuleDef *m = JS_VALUE_GET_PTR(f);
  JS_FreeValue(c, f);
  return m;
}

/* Run every pending promise job (the script's `await`s resume here); an exception a job throws
 * ends the sequence. */
static void run_jobs(const char *what) {
  JSContext *c;
  int r;
  while ((r = JS_ExecutePendingJob(rt, &c)) != 0)
    if (r < 0) die_exception(what);
}

/* ---- the interpreter ----------------------------------------------------------------------- */
static void make_interpreter(void) {
  if (ctx) return;
  /* the memory limit is js_heap_funcs' (alloc.c), so that the error at the limit can be made */
  if (!(rt = JS_NewRuntime2(&js_heap_funcs, 0))) aici_fail("js: cannot create the interpreter (out of memory)");
  JS_SetMaxStackSize(rt, JS_STACK_LIMIT);
  JS_SetInterruptHandler(rt, on_interrupt, 0);
  if (!(ctx = JS_NewContext(rt))) aici_fail("js: cannot create the interpreter's context (out of memory)");
  JSValue global = JS_GetGlobalObject(ctx), api = JS_NewObject(ctx);
  JS_SetPropertyFunctionList(ctx, api, api_funcs, sizeof api_funcs / sizeof api_funcs[0]);
  JS_DefinePropertyValueStr(ctx, api, "_checkSyntax", JS_NewCFunction(ctx, api_check_syntax, "_checkSyntax", 1), 0);
  tokset_define(api);
  constraint_define(api);
  JS_SetPropertyStr(ctx, global, "aici", api);
  JS_FreeValue(ctx, global);
  for (int i = 0; i < N_ATOMS; i++) atoms[i] = JS_NewAtom(ctx, ATOM_NAMES[i]);
  JSValue r = JS_Eval(ctx, PRELUDE, sizeof PRELUDE - 1, "<aici prelude>", JS_EVAL_TYPE_GLOBAL);
  if (JS_IsException(r)) die_exception("prelude");
  JS_FreeValue(ctx, r);
  r = JS_Eval(ctx, LIB, sizeof LIB, "<aici lib>", JS_EVAL_TYPE_GLOBAL);
  if (JS_IsException(r)) die_exception("the library");
  JS_FreeValue(ctx, r);
  JS_SetModuleLoaderFunc(rt, 0, load_module, 0);
  mid_fn = JS_UNDEFINED;
  gc_later();
}

AICI_EXPORT_INIT void js_init(void) {
  make_interpreter();
  if ((trie = aici_trie())) aici_token_bytes(0, 0);
  /* Not gr_prepare_tokenizer here: its trie slices take ~16 MiB of linear memory on Qwen2's
   * vocabulary, in every instance, and would leave less than the interpreter's 40 MiB limit
   * below the instance's 64 MiB (an allocation bomb would trap in malloc, not throw in JS).
   * aici.Grammar prepares them on first use (constraint.c). */
  /* The SDK's result arena gets its first chunk (64 KiB) now, in the snapshot: a script that
   * caught a gradual out-of-memory has freed its heap in pieces too small for a 64 KiB chunk,
   * and its result must still find room. */
  aici_tmp_alloc(1);
  /* A bound script that calls aici.init (runtime/loader/js_bind.py): the host gives the init the script as
   * `arg`, and the script is evaluated here, so every request starts from what its top level and
   * its init functions built; elsewhere the init's `arg` is empty and the first call evaluates it. */
  uint32_t n;
  aici_free(aici_arg(&n));
  if (n) {
    in_init = true;
    load_script();
    in_init = false;
  }
  JS_RunGC(rt);
  gc_later();
}

/* Math.random from WASI random_get (seeded per request by the runtime: replayable). */
static JSValue math_random(JSContext *c, JSValueConst this, int argc, JSValueConst *argv) {
  uint64_t r = 0;
  if (getentropy(&r, sizeof r)) return JS_ThrowInternalError(c, "random_get failed");
  return JS_NewFloat64(c, (double)(r >> 11) * (1.0 / 9007199254740992.0));
}

/* A module script: a line that starts (after blanks), outside strings, template literals and
 * comments, with an `import` or `export` declaration. (QuickJS's JS_DetectModule calls every
 * script that also parses as a module one, which would make a plain script's top-level names
 * module-local.) A regex literal holding a quote can mislead the scan; such a script is run as
 * what the scan says, and its error shows it. */
static bool is_module(const char *s, uint32_t n) {
  enum { CODE, LINE_C, BLOCK_C, STR, TMPL } st = CODE;
  char quote = 0;
  int tmpl_depth[32], nt = 0, braces = 0;   /* brace depth at each open ${ of a template */
  bool line_start = true;
  char prev = ';';                          /* the last code character: a '/' after one of
                                             * "(,=:[!&|?{};+-*%<>~^" or a line start opens a regex */
  for (uint32_t i = 0; i < n; i++) {
    char c = s[i];
    switch (st) {
      case LINE_C: if (c == '\n') st = CODE, line_start = true; continue;
      case BLOCK_C: if (c == '*' && i + 1 < n && s[i + 1] == '/') st = CODE, i++; continue;
      case STR: if (c == '\\') i++; else if (c == quote || c == '\n') st = CODE; continue;
      case TMPL:
        if (c == '\\') i++;
        else if (c == '`') st = CODE;
        else if (c == '$' && i + 1 < n && s[i + 1] == '{' && nt < 32) tmpl_depth[nt++] = braces++, i++, st = CODE;
        continue;
      case CODE: break;
    }
    if (c == '\n') { line_start = true; continue; }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    if (line_start && n - i > 6 && (!memcmp(s + i, "import", 6) || !memcmp(s + i, "export", 6))) {
      char d = s[i + 6];
      if (d == ' ' || d == '\t' || d == '{' || d == '*' || (s[i] == 'i' && (d == '"' || d == '\''))) return true;
    }
    bool was_line_start = line_start;
    line_start = false;
    if (c == '/' && i + 1 < n && s[i + 1] == '/') st = LINE_C, i++;
    else if (c == '/' && i + 1 < n && s[i + 1] == '*') st = BLOCK_C, i++;
    else if (c == '/' && (was_line_start || strchr("(,=:[!&|?{};+-*%<>~^", prev))) {   /* a regex literal */
      bool cls = false;
      for (i++; i < n && s[i] != '\n'; i++) {
        if (s[i] == '\\') i++;
        else if (s[i] == '[') cls = true;
        else if (s[i] == ']') cls = false;
        else if (s[i] == '/' && !cls) break;
      }
      prev = 'r';
      continue;
    }
    else if (c == '"' || c == '\'') st = STR, quote = c;
    else if (c == '`') st = TMPL;
    else if (c == '{') braces++;
    else if (c == '}') {
      if (nt && tmpl_depth[nt - 1] == braces - 1) nt--, st = TMPL;
      braces--;
    }
    prev = c;
  }
  return false;
}

static void load_script(void) {
  uint32_t n, len = 0;   /* the argument: script, then NUL and the script's argument */
  char *a = (char *)aici_arg(&n);
  while (len < n && a[len]) len++;
  arg_skip = len + 1;
  JSValue global = JS_GetGlobalObject(ctx);
  JSValue math = JS_GetPropertyStr(ctx, global, "Math");
  JS_SetPropertyStr(ctx, math, "random", JS_NewCFunction(ctx, math_random, "random", 0));
  JS_FreeValue(ctx, math);
  bool module = is_module(a, len);
  JSValue r = JS_Eval(ctx, a, len, "<script>", module ? JS_EVAL_TYPE_MODULE | JS_EVAL_FLAG_COMPILE_ONLY : JS_EVAL_TYPE_GLOBAL);
  aici_free(a);
  if (JS_IsException(r)) die_exception("the script failed");
  JSValue ns = JS_UNDEFINED;
  if (module) {
    JSModuleDef *m = JS_VALUE_GET_PTR(r);
    r = JS_EvalFunction(ctx, r);   /* a promise: the module's evaluation */
    if (JS_IsException(r)) die_exception("the script failed");
    run_jobs("the script failed");
    if (JS_PromiseState(ctx, r) == JS_PROMISE_REJECTED) {
      JS_Throw(ctx, JS_PromiseResult(ctx, r));
      die_exception("the script failed");
    }
    ns = JS_GetModuleNamespace(ctx, m);
  } else {
    run_jobs("the script failed");
  }
  JS_FreeValue(ctx, r);
  if (module) {
    mid_fn = JS_GetPropertyStr(ctx, ns, "midProcess");
    JS_FreeValue(ctx, ns);
  } else {   /* a function declaration, or const/let/var: the global scope's binding */
    static const char FIND[] = "typeof midProcess === 'function' ? midProcess : undefined";
    mid_fn = JS_Eval(ctx, FIND, sizeof FIND - 1, "<aici>", JS_EVAL_TYPE_GLOBAL);
    if (JS_IsException(mid_fn)) die_exception("the script failed");
  }
  JSValue api = JS_GetPropertyStr(ctx, global, "aici");
  JSValue started = JS_GetPropertyStr(ctx, api, "_libStarted");
  if (!JS_IsFunction(ctx, mid_fn) && JS_ToBool(ctx, started)) {
    JS_FreeValue(ctx, mid_fn);
    mid_fn = JS_GetPropertyStr(ctx, api, "_libMidProcess");
  }
  JS_FreeValue(ctx, started);
  JS_FreeValue(ctx, api);
  JS_FreeValue(ctx, global);
  if (!JS_IsFunction(ctx, mid_fn)) {
    const char *m = module ? "the module exports no function midProcess(arg) and calls no aici.start(fn)"
                           : "the script defines no function midProcess(arg) and calls no aici.start(fn)";
    die("the script failed", m, strlen(m));
  }
  script_loaded = true;
}

/* ---- results ------------------------------------------------------------------------------- */
/* Keys of `obj` must be among `allowed` (atom indices, -1-terminated): a typo is an error, not
 * a default. */
static int check_keys(JSValueConst obj, const char *path, const int *allowed) {
  JSPropertyEnum *props;
  uint32_t n;
  if (JS_GetOwnPropertyNames(ctx, &props, &n, obj, JS_GPN_STRING_MASK | JS_GPN_ENUM_ONLY)) return -1;
  int rc = 0;
  for (uint32_t i = 0; i < n && !rc; i++) {
    bool ok = false;
    for (const int *a = allowed; *a >= 0; a++) ok |= props[i].atom == atoms[*a];
    if (!ok) {
      const char *k = JS_AtomToCString(ctx, props[i].atom);
      char msg[160];
      snprintf(msg, sizeof msg, "%s has an unknown field '%s'", path, k ? k : "?");
      JS_FreeCString(ctx, k);
      throw_shape(msg, "");
      rc = -1;
    }
  }
  JS_FreePropertyEnum(ctx, props, n);
  return rc;
}

/* obj[name]; *present: neither undefined nor null. A getter that throws leaves JS_EXCEPTION
 * (callers return -1 on it, so that exception, not a shape error, is reported). */
static JSValue get_field(JSValueConst obj, int name, bool *present) {
  int own = JS_GetOwnProperty(ctx, 0, obj, atoms[name]);   /* own properties only: never a prototype's */
  if (own <= 0) {
    *present = false;
    return own < 0 ? JS_EXCEPTION : JS_UNDEFINED;
  }
  JSValue v = JS_GetProperty(ctx, obj, atoms[name]);
  *present = !JS_IsUndefined(v) && !JS_IsNull(v) && !JS_IsException(v);
  return v;
}

static int tokens_field(JSValueConst obj, int name, const char *path, uint32_t **t, uint32_t *n) {
  bool present;
  JSValue v = get_field(obj, name, &present);
  *t = 0, *n = 0;
  if (JS_IsException(v)) return -1;
  if (present) {
    char where[96];
    snprintf(where, sizeof where, "%s.%s", path, ATOM_NAMES[name]);
    *t = tokens_from(ctx, v, n, where);
  }
  JS_FreeValue(ctx, v);
  return present && !*t ? -1 : 0;
}

static const int BRANCH_KEYS[] = {A_SAMPLE_MASK, A_TEMPERATURE, A_SPLICES, -1};
static const int SPLICE_KEYS[] = {A_WHEN_SAMPLED, A_BACKTRACK, A_FF_TOKENS, -1};

static int add_splice(aici_branch_t *b, JSValueConst sp, const char *path) {
  if (!JS_IsObject(sp) || JS_IsArray(sp)) { throw_shape(path, "is not an object {whenSampled?, backtrack?, ffTokens?}"); return -1; }
  if (check_keys(sp, path, SPLICE_KEYS)) return -1;
  uint32_t *when, n_when, *ff, n_ff, bt = 0;
  bool present;
  JSValue v = get_field(sp, A_BACKTRACK, &present);
  if (JS_IsException(v)) return -1;
  char msg[96];
  snprintf(msg, sizeof msg, "%s.backtrack", path);
  if (present && check_uint(ctx, v, 4294967295.0, &bt, msg)) {
    JS_FreeValue(ctx, v);
    return -1;
  }
  JS_FreeValue(ctx, v);
  if (tokens_field(sp, A_WHEN_SAMPLED, path, &when, &n_when)) return -1;
  if (tokens_field(sp, A_FF_TOKENS, path, &ff, &n_ff)) { free(when); return -1; }
  aici_branch_splice(b, when, n_when, bt, ff, n_ff);   /* copies the lists */
  free(when);
  free(ff);
  return 0;
}

/* prefix + "[" + i + "]" into out (at least 24 bytes more than prefix): no printf per step. */
static void indexed(char *out, size_t cap, const char *prefix, uint64_t i) {
  size_t n = strlen(prefix);
  if (n + 24 > cap) n = cap - 24;
  memcpy(out, prefix, n);
  char digits[21];
  int k = 0;
  do digits[k++] = (char)('0' + i % 10); while ((i /= 10) && k < 20);
  out[n++] = '[';
  while (k) out[n++] = digits[--k];
  out[n++] = ']';
  out[n] = 0;
}

static int add_branch(aici_result_t *res, JSValueConst br, uint32_t i) {
  char path[48];
  indexed(path, sizeof path, "branches", i);
  if (!JS_IsObject(br) || JS_IsArray(br)) { throw_shape(path, "is not an object {sampleMask?, temperature?, splices?}"); return -1; }
  if (check_keys(br, path, BRANCH_KEYS)) return -1;
  aici_branch_t *b = aici_branch(res);
  bool present;
  JSValue v = get_field(br, A_SAMPLE_MASK, &present);
  if (JS_IsException(v)) return -1;
  if (present) {
    tokset_t *t = JS_GetOpaque(v, tokset_class);
    JS_FreeValue(ctx, v);   /* the set outlives the call: the result holds it until the next call */
    if (!t) { throw_shape(path, ".sampleMask is not an aici.TokenSet"); return -1; }
    if (t->gen_ptr && *t->gen_ptr != t->gen) { throw_shape(path, ".sampleMask is a JsonSchema mask a later mask() replaced (copy() it)"); return -1; }
    aici_branch_mask(b, t->set);
  } else {
    JS_FreeValue(ctx, v);
  }
  v = get_field(br, A_TEMPERATURE, &present);
  if (JS_IsException(v)) return -1;
  if (present) {
    double temp;
    if (!JS_IsNumber(v) || JS_ToFloat64(ctx, &temp, v) || !(temp >= 0 && temp <= 3.4e38)) {
      const char *s = JS_IsNumber(v) ? JS_ToCString(ctx, v) : 0;
      JS_ThrowRangeError(ctx, "%s.temperature: %s is not a finite number >= 0", path, s ? s : type_name(v));
      JS_FreeCString(ctx, s);
      JS_FreeValue(ctx, v);
      return -1;
    }
    aici_branch_temperature(b, (float)temp);
  }
  JS_FreeValue(ctx, v);
  v = get_field(br, A_SPLICES, &present);
  if (JS_IsException(v)) return -1;
  if (present) {
    int64_t n;
    if (!JS_IsArray(v) || JS_GetLength(ctx, v, &n) < 0) { JS_FreeValue(ctx, v); throw_shape(path, ".splices is not an array"); return -1; }
    for (int64_t k = 0; k < n; k++) {
      char sp_path[72], prefix[64];
      memcpy(prefix, path, strlen(path));
      memcpy(prefix + strlen(path), ".splices", 9);
      indexed(sp_path, sizeof sp_path, prefix, (uint64_t)k);
      JSValue sp = JS_GetPropertyInt64(ctx, v, k);
      int bad = add_splice(b, sp, sp_path);
      JS_FreeValue(ctx, sp);
      if (bad) { JS_FreeValue(ctx, v); return -1; }
    }
  }
  JS_FreeValue(ctx, v);
  return 0;
}

/* The script's result -> the WIT result; -1 with a JS exception pending when it is misshapen. */
static int convert_result(JSValueConst r, aici_result_t *res) {
  int native = native_result(r, res);   /* a Follower's result: no property walk */
  if (native) return native < 0 ? -1 : 0;
  if (!JS_IsObject(r) || JS_IsArray(r)) { throw_shape("the result", "is not an object {branches: [...]}"); return -1; }
  static const int keys[] = {A_BRANCHES, -1};
  if (check_keys(r, "the result", keys)) return -1;
  JSValue br = JS_GetProperty(ctx, r, atoms[A_BRANCHES]);
  int64_t n;
  if (JS_IsException(br)) return -1;   /* a getter threw: its exception stands */
  if (!JS_IsArray(br) || JS_GetLength(ctx, br, &n) < 0) { JS_FreeValue(ctx, br); throw_shape("branches", "is not an array"); return -1; }
  for (int64_t i = 0; i < n; i++) {
    JSValue b = JS_GetPropertyInt64(ctx, br, i);
    int bad = add_branch(res, b, (uint32_t)i);
    JS_FreeValue(ctx, b);
    if (bad) { JS_FreeValue(ctx, br); return -1; }
  }
  JS_FreeValue(ctx, br);
  return 0;
}

/* ---- one step ------------------------------------------------------------------------------ */
void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  make_interpreter();          /* no-op after the init (or the first call) */
  JS_UpdateStackTop(rt);       /* the host calls in at the top of the shadow stack */
  if (aicirt_time_notice) aicirt_time_notice = 0;   /* set by an earlier call's host (a page written only then) */
  if (!script_loaded) load_script();
  JSValue a = JS_NewObject(ctx);
  JS_SetProperty(ctx, a, atoms[A_BACKTRACK], JS_NewUint32(ctx, arg->backtrack));
  JS_SetProperty(ctx, a, atoms[A_TOKENS], tokens_array(ctx, arg->tokens, arg->n_tokens));
  JS_SetProperty(ctx, a, atoms[A_SAMPLED], arg->has_sampled ? JS_NewUint32(ctx, arg->sampled) : JS_UNDEFINED);
  JS_SetProperty(ctx, a, atoms[A_FORK_GROUP], tokens_array(ctx, arg->fork_group, arg->n_fork_group));
  JS_SetProperty(ctx, a, atoms[A_CALL_INDEX], JS_NewUint32(ctx, arg->call_index));
  cur_arg = arg;
  JSValue r = JS_Call(ctx, mid_fn, JS_UNDEFINED, 1, (JSValueConst *)&a);
  JS_FreeValue(ctx, a);
  if (JS_IsException(r)) die_exception("midProcess threw");
  run_jobs("midProcess threw");
  if (JS_IsPromise(r)) {   /* an async midProcess (or the library's): its value once the jobs ran */
    JSPromiseStateEnum ps = JS_PromiseState(ctx, r);
    JSValue v = ps == JS_PROMISE_PENDING ? JS_UNDEFINED : JS_PromiseResult(ctx, r);
    JS_FreeValue(ctx, r);
    if (ps == JS_PROMISE_REJECTED) {
      JS_Throw(ctx, v);
      die_exception("midProcess threw");
    }
    if (ps == JS_PROMISE_PENDING) {
      const char *m = "midProcess's promise is still pending after every job ran: it awaits something other than "
                      "the next call (there are no timers or I/O here)";
      die("midProcess", m, strlen(m));
    }
    r = v;
  }
  int bad = convert_result(r, res);
  JS_FreeValue(ctx, r);
  cur_arg = 0;
  if (bad) die_exception("midProcess");
}
