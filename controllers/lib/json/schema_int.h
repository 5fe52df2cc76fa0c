/* schema_int.h: what the schema compiler's parts share (internal): its limits, the compile
 * context, the functions one part calls in another. schema.c: errors, pointers, keywords, $ref,
 * machines and the dispatcher; schema_string.c: strings and numbers; schema_object.c: arrays,
 * objects and free-form values; schema_allof.c: allOf merged and oneOf's disjointness;
 * schema_not.c: complements (`not`, oneOf made exact). */
#ifndef SCHEMA_INT_H
#define SCHEMA_INT_H
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
  aici_buf_t ptr;                            /* where the compiler is, as a JSON pointer */
  char ws[40];
  uint32_t loops;
  uint32_t depth;                      /* nesting of sc_emit(): recursion through allOf is bounded */
  uint32_t fdepth, fptr0;              /* nesting of sc_flatten() ($ref loops through allOf), and the
                                          pointer's length where the outermost began */
  uint64_t flat_cap;                   /* checking literals (0: off): strings inline, length bounds
                                          clamped to this (one more than the longest literal) */
} cx_t;

extern const jv_t FALSE_SCHEMA, ANY_MARK;    /* compared by address: one of each */
extern const char *const ANNOTATIONS[];
extern uint64_t key_arg;               /* the arg of the next machine_find / machine_for */

#define UNSUPPORTED(c, kw, detail) sc_fail(c, "unsupported: ", kw, detail)
#define NOT_IN "\x01not-in"
enum { MK_KEYLANG = 8, MK_ANY_ORDER = 9, MK_COUNTED = 10 };
#define KEYLANG_STATES 1024u           /* product states a key language may have */

void sc_fail(cx_t *c, const char *what, const char *kw, const char *detail);
uint32_t sc_ptr_push(cx_t *c, const char *seg, uint32_t n);
uint32_t sc_ptr_pushs(cx_t *c, const char *seg);
uint32_t sc_ptr_pushi(cx_t *c, uint32_t i);
void sc_ptr_pop(cx_t *c, uint32_t at);
bool sc_ignored(cx_t *c, const char *kw);
void sc_relax(cx_t *c, const char *kw);
bool sc_in_list(const jv_t *k, const char *const *l);
bool sc_is_constraint_key(const jv_t *k);
bool sc_check_values(cx_t *c, const jv_t *s);
bool sc_check_keywords(cx_t *c, const jv_t *s);
const jv_t *sc_resolve(cx_t *c, const jv_t *ref);
int32_t sc_machine_find(cx_t *c, const jv_t *schema, uint32_t kind);
uint32_t sc_machine_for(cx_t *c, const jv_t *schema, uint32_t kind, const char *ptr, uint32_t ptr_len);
void sc_set_text(cx_t *c, uint32_t m, const char *text, uint32_t n);
void sc_emit_call(cx_t *c, aici_buf_t *b, uint32_t m);
void sc_emit_value(cx_t *c, aici_buf_t *b, const jv_t *s);
void sc_emit_value_within(cx_t *c, aici_buf_t *b, const jv_t *s, uint32_t inline_max);
void sc_emit_chars(aici_buf_t *b, uint64_t min, uint64_t max, bool unbounded);
bool sc_emit_format(aici_buf_t *b, const char *f);
bool sc_get_uint(cx_t *c, const jv_t *s, const char *kw, uint64_t *out);
void sc_emit_string(cx_t *c, aici_buf_t *b, const jv_t *s);
void sc_emit_num(cx_t *c, aici_buf_t *b, const jv_t *s, bool is_int);
void sc_emit_array(cx_t *c, aici_buf_t *b, const jv_t *s);
bool sc_emit_keylang(cx_t *c, aici_buf_t *b, const aici_buf_t *pats, uint32_t n_pats, int32_t target, const aici_buf_t *keys);
void sc_emit_object(cx_t *c, aici_buf_t *b, const jv_t *s);
void sc_emit_any_value(cx_t *c, aici_buf_t *b);
jv_t *sc_obj_without(const jv_t *s, const char *const *drop);
jv_t *sc_all_of2(const jv_t *a, const jv_t *b);
uint32_t sc_type_bits(const jv_t *t);
jv_t *sc_types_value(uint32_t bits);
const jv_t *sc_flatten(cx_t *c, const jv_t *s);
uint32_t sc_kinds_of(cx_t *c, const jv_t *s);
const jv_t *sc_value_schema(cx_t *c, const jv_t *s, const jv_t *key);
bool sc_one_of_exact(cx_t *c, const jv_t *alts, const jv_t *rest, uint32_t *excluded);
const jv_t *sc_strings_of(cx_t *c, const jv_t *s);
jv_t *sc_negate(cx_t *c, const jv_t *s, uint32_t depth, uint32_t U);
const jv_t *sc_without_not(cx_t *c, const jv_t *s);
bool sc_emit_one_of_by_complements(cx_t *c, aici_buf_t *b, const jv_t *alts, const jv_t *rest, bool siblings);
bool sc_obviously_empty(cx_t *c, const jv_t *s, uint32_t depth);
void sc_emit(cx_t *c, aici_buf_t *b, const jv_t *s);

#endif
