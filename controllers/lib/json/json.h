/* Internal header of the `json` controller: a JSON reader (DOM), a regex text builder, and the
 * schema compiler that turns a JSON Schema into regex text for the SDK's DFA engine. */
#ifndef JSON_CTRL_H
#define JSON_CTRL_H
#include "aici.h"

/* ---- JSON values ------------------------------------------------------------------------ */
enum { JV_NULL, JV_FALSE, JV_TRUE, JV_NUM, JV_STR, JV_ARR, JV_OBJ };
typedef struct jv {
  uint8_t kind;
  uint32_t n;                 /* STR/NUM: bytes of s; ARR/OBJ: items */
  const char *s;              /* STR: decoded UTF-8; NUM: the number's text as written */
  double num;
  struct jv *items;           /* ARR: values; OBJ: values (keys[i] names items[i]) */
  struct jv *keys;            /* OBJ: JV_STR keys, in document order */
} jv_t;

/* NULL on a syntax error (*err gets a static message, *at the byte offset). */
jv_t *jv_parse(const char *text, uint32_t len, const char **err, uint32_t *at);
const jv_t *jv_get(const jv_t *obj, const char *key);          /* NULL: absent or not an object */
bool jv_str_is(const jv_t *v, const char *s);
bool jv_equal(const jv_t *a, const jv_t *b);
bool jv_is_int(const jv_t *v);                                  /* a number with no fraction */
jv_t *jv_new(uint8_t kind);
void jv_obj_put(jv_t *obj, const char *key, uint32_t klen, const jv_t *val);   /* appends */

/* ---- text into the SDK's growable buffer (aici_buf_t) ------------------------------------- */
void sb_byte(aici_buf_t *b, uint8_t c);         /* one literal byte, escaped for the regex parser */
void sb_lit(aici_buf_t *b, const char *s, uint32_t n);   /* literal bytes */
void sb_uint(aici_buf_t *b, uint64_t v);
/* The compact JSON text of `v` (strings escaped as Python's json.dumps(ensure_ascii=False)). */
void jv_write(aici_buf_t *b, const jv_t *v);
void jv_write_str(aici_buf_t *b, const char *s, uint32_t n);

/* ---- regex fragments -------------------------------------------------------------------- */
/* Code-point ranges [lo, hi] (sorted, disjoint) as a regex over their canonical JSON string
 * encoding: raw UTF-8, and the escapes JSON needs for ", \ and control characters. */
typedef aici_cp_range_t cp_range_t;             /* the SDK's code-point sets (aici_cps_add, _normalize, _negate) */
typedef aici_cp_set_t cp_set_t;
bool emit_cp_set(aici_buf_t *b, cp_set_t *s);         /* false: empty set (emits a dead class) */
void emit_strchar(aici_buf_t *b);                     /* any one character of a JSON string */
/* An ECMA-262 `pattern` (search semantics) as a regex over the JSON string's contents. */
bool emit_pattern(aici_buf_t *b, const char *pat, uint32_t len, const char **why);
/* The same with every unbounded repeat (and unanchored end) allowed at most `cap` more repeats
 * (PAT_NO_CAP: none), an unanchored end at least `end_min` characters, and the language's
 * shortest and longest match in characters (*hi UINT64_MAX: unbounded). */
#define PAT_NO_CAP UINT64_MAX
bool emit_pattern_capped(aici_buf_t *b, const char *pat, uint32_t len, uint64_t cap, uint64_t end_min, uint64_t *lo,
                         uint64_t *hi, const char **why);

/* ---- numbers ----------------------------------------------------------------------------- */
typedef struct {
  bool has_lo, has_hi, lo_excl, hi_excl;
  double lo, hi;
  const char *lo_text, *hi_text;      /* the bounds as written (JSON number text) */
  uint32_t lo_len, hi_len;
} bounds_t;
/* Whether a bound's JSON text can be compared exactly (magnitude under 2^64 - 2, at most 32
 * fraction digits); false with *why. */
bool number_bound_ok(const char *text, uint32_t n, const char **why);
/* Integers (is_int) or numbers within bounds; false (with *why) if the bounds cannot be done. */
bool emit_number(aici_buf_t *b, bool is_int, const bounds_t *bd, uint32_t frac_digits, const char **why);

/* ---- the schema compiler ------------------------------------------------------------------ */
typedef struct {
  uint32_t whitespace;        /* 0: compact; N: up to N whitespace bytes between tokens */
  bool coerce_one_of;         /* oneOf whose branches may overlap: compiled as anyOf */
  const char *ignore;         /* comma-separated keywords not enforced (stated in the log) */
  bool any_order;             /* object keys in any order (each at most once), not schema order */
} json_opts_t;

/* ---- any_order objects (anyorder.c): machines made on first entry ------------------------ */
typedef struct dyn dyn_t;
typedef uint32_t (*dyn_reserve_fn)(void *ctx);   /* a fresh machine id; 0: none left */
dyn_t *dyn_new(void);
/* An object of n entries (`"key":value` regexes, `required` flags), `add` the additional-property
 * entry (NULL: none); returns its index. */
uint32_t dyn_object(dyn_t *d, uint32_t n, const aici_buf_t *entries, const bool *required, const aici_buf_t *add, bool nonempty,
                    const char *ws);
void dyn_bind_start(dyn_t *d, uint32_t obj, uint32_t id);   /* machine `id`: the object, nothing written */
/* The regex of dynamic machine `id` into *out, its successors reserved through `reserve`; false:
 * `id` is no dynamic machine. */
bool dyn_text(dyn_t *d, uint32_t id, dyn_reserve_fn reserve, void *ctx, aici_buf_t *out);

/* The compiled schema: machine 0 is the document; a regex may call machine k by the bytes
 * CALL_BYTE, k >> 8, k & 255 (CALL_BYTE never occurs in UTF-8 text), which stands for one value
 * of machine k's language: $ref targets, free-form values and large sub-schemas are machines. */
#define CALL_BYTE 0xffu
#define MAX_MACHINES 4096u
/* text NULL: a dynamic machine. counted: a string machine (`"`, content, `"`, no calls) whose
 * content must also be lo..hi characters long (hi CHARS_UNBOUNDED: no maximum); the matcher
 * keeps the count beside the DFA state (cfg_t.n), so its memory does not grow with the bounds. */
#define CHARS_UNBOUNDED 0xffffffffu
typedef struct { char *text; uint32_t len; bool counted; uint32_t lo, hi; } machine_src_t;
typedef struct {
  machine_src_t *m;
  uint32_t n;
  aici_buf_t log;                   /* relaxations taken on request (ignore=...) */
  /* Dynamic machines (text NULL): dyn_write(dyn, id, reserve, ctx, out) writes machine id's
   * regex when a configuration first enters it (NULL: none; any_order objects set dyn_text). A
   * pointer, so that the matcher links without anyorder.c. */
  dyn_t *dyn;
  bool (*dyn_write)(dyn_t *d, uint32_t id, dyn_reserve_fn reserve, void *ctx, aici_buf_t *out);
} compiled_t;

/* ---- length-counted strings (lencount.c) ------------------------------------------------- */
/* The tracker of a counted machine's characters: where in the JSON text of a string a byte is. */
enum { LC_IN = 0, LC_PRE = 1, LC_END = 2, LC_ESC = 3, LC_U4 = 4, LC_U1 = 7, LC_C3 = 8, LC_C1 = 10, LC_DEAD = 15 };
/* The tracker after byte b from t; *inc 1 when b completes a character. */
static inline uint32_t lc_track(uint32_t t, uint8_t b, uint32_t *inc) {
  *inc = 0;
  switch (t) {
    case LC_PRE: return b == '"' ? LC_IN : LC_DEAD;
    case LC_IN:
      if (b == '"') return LC_END;
      if (b == '\\') return LC_ESC;
      if (b < 0x80) { *inc = 1; return LC_IN; }
      if (b < 0xc0) return LC_DEAD;
      return b < 0xe0 ? LC_C1 : b < 0xf0 ? LC_C1 - 1 : b < 0xf8 ? LC_C3 : LC_DEAD;
    case LC_ESC:
      if (b == 'u') return LC_U4;
      *inc = 1;
      return LC_IN;
    case LC_U1: *inc = 1; return LC_IN;
    case LC_C1: *inc = 1; return LC_IN;
    case LC_END: case LC_DEAD: return LC_DEAD;
    default: return t + 1;             /* U4..U2, C3..C2: one byte more of the character */
  }
}
typedef struct lencount lencount_t;
/* The tables of a counted machine whose regex is `re` (see machine_src_t); NULL with *err (heap)
 * when they would be too large (over 8192 product states, or 4 MiB of layers for minLength). */
lencount_t *lencount_new(aici_regex_t *re, uint32_t lo, uint32_t hi, char **err);
void lencount_free(lencount_t *L);
/* Whether DFA state s with n = count << 4 | tracker can still end as a valid string. */
bool lencount_live(const lencount_t *L, uint32_t s, uint32_t n);
/* The count after byte b (saturated at lo when there is no maximum) into *n2, and whether DFA
 * state s2 (the state after b) with it is live. */
bool lencount_next(const lencount_t *L, uint32_t s2, uint32_t n, uint8_t b, uint32_t *n2);
/* In a DFA state every character leads back to (tracker LC_IN), the most characters k <= kmax
 * that keep it live (liveness there only falls as k grows). */
uint32_t lencount_room(const lencount_t *L, uint32_t s, uint32_t n, uint32_t kmax);
/* Whether no token (of at most longest_token characters) can meet a bound from n on: the
 * mask is then that of every such count. */
bool lencount_settled(const lencount_t *L, uint32_t n, uint32_t longest_token);

/* ---- key languages (keylang.c) ------------------------------------------------------------ */
/* Key contents in pattern `target`'s language (target < 0: in none of the patterns), in S (any
 * canonical string content) and none of `keys` (a regex of the listed keys' contents; len 0:
 * none), as the product DFA of those regexes; NULL when it has over `limit` states. Its live
 * states other than the plain STRCHAR* ones are machines 0..keylang_machines()-1 (0: the start,
 * unless keylang_start_is_free: S alone is left, or keylang_empty); keylang_text writes machine i's regex, calling
 * the others as machines base + j. */
#define KEYLANG_ALL (-2)               /* target: in every pattern's language (an intersection) */
typedef struct keylang keylang_t;
keylang_t *keylang_new(const char *const *pats, const uint32_t *pat_lens, uint32_t n_pats, int32_t target,
                       const char *keys, uint32_t keys_len, uint32_t limit);
bool keylang_empty(const keylang_t *L);
bool keylang_start_is_free(const keylang_t *L);
uint32_t keylang_machines(const keylang_t *L);
void keylang_text(const keylang_t *L, uint32_t machine, uint32_t base, aici_buf_t *out);
/* The start's regex, inline when keylang_start_is_free (no machine), else a call to machine base. */
void keylang_start_text(const keylang_t *L, uint32_t base, aici_buf_t *out);
void keylang_free(keylang_t *L);

/* ---- language questions (empty.c): empty machines, inclusion of two regexes -------------- */
/* prod[i] for machines 0..n-1: machine i's language has a string whose calls all go to
 * productive machines (re[i] NULL, a dynamic machine made later: taken as productive; lc[i]:
 * a counted machine, productive when its start is live). A search that would visit over 4096
 * DFA states of one machine takes it as productive (never an error for a schema that has
 * documents). */
void machines_productive(aici_regex_t *const *re, lencount_t *const *lc, uint32_t n, bool *prod);
/* Regex text `t` with every call into a machine that is not productive written as a dead class
 * (heap, *out_len its length); NULL when it calls none. */
char *text_without_dead_calls(const char *t, uint32_t len, const bool *prod, uint32_t n, uint32_t *out_len);

/* Whether every string regex `a` matches regex `b` matches too (both over the same bytes, no
 * calls); false too when the check would visit over 16384 product states. */
bool regex_subset(const char *a, uint32_t na, const char *b, uint32_t nb);

/* false on error: *err gets a heap message such as "unsupported: not at #/properties/a". */
bool schema_compile(const jv_t *schema, const json_opts_t *o, compiled_t *out, char **err);

#endif
