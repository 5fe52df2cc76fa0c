/* compile_int.h: what the program compiler's two parts share (internal): its context and the
 * calls between them. compile.c: the context, pointers, fields and the format dispatcher;
 * compile_leaf.c: the leaf formats (text, json, tokens), tags, triggers, repeats, captures. */
#ifndef COMPILE_INT_H
#define COMPILE_INT_H
#include "program.h"

typedef struct {
  program_t *p;
  char *err;
  char ptr[512];
  uint32_t plen;
  float temp;
  bool has_temp;
  uint32_t repeat_budget;
} cx_t;

static const char *TYPES = "const_string, regex, json_schema, grammar, any_text, sequence, or, optional, star, "
                           "plus, repeat, tag, triggered_tags, tags_with_separator, token, exclude_token, any_tokens, "
                           "fork, wait, backtrack";

/* The JSON pointer of the element being compiled ("/" at the root), as text of `*n` bytes. */

char *pc_here_copy(const cx_t *c);
bool pc_fail(cx_t *c, const char *why);
bool pc_failn(cx_t *c, const char *why, const char *s, uint32_t n);
uint32_t pc_push_key(cx_t *c, const char *k);
uint32_t pc_push_idx(cx_t *c, uint32_t i);
uint32_t pc_node(cx_t *c, uint8_t kind);
void pc_add_next(cx_t *c, uint32_t from, uint32_t to);
uint32_t pc_edge(cx_t *c, uint8_t kind, uint32_t to);
uint32_t pc_lit(cx_t *c, const char *s, uint32_t n, uint32_t cont);
const jv_t *pc_field(cx_t *c, const jv_t *f, const char *key, uint8_t kind, bool required);
bool pc_flag(cx_t *c, const jv_t *f, const char *key);
bool pc_uint_field(cx_t *c, const jv_t *f, const char *key, int64_t dflt, int64_t lo, int64_t *out);
bool pc_strings(cx_t *c, const jv_t *f, const char *key, const jv_t **out, bool nonempty_each);
uint32_t pc_lits_or(cx_t *c, const jv_t *list, uint32_t cont);
uint32_t pc_text_leaf(cx_t *c, const jv_t *f, uint32_t cont, const jv_t *extra, int64_t max_tokens);
uint32_t pc_json_leaf(cx_t *c, const jv_t *f, uint32_t cont);
bool pc_token_of(cx_t *c, const jv_t *v, aici_token_t *out);
uint32_t pc_tok_leaf(cx_t *c, const jv_t *list, bool exclude, aici_token_t single, uint32_t cont);
uint32_t pc_tag(cx_t *c, const jv_t *f, uint32_t cont);
uint32_t pc_triggered(cx_t *c, const jv_t *f, uint32_t cont);
uint32_t pc_with_separator(cx_t *c, const jv_t *f, uint32_t cont);
uint32_t pc_repeat(cx_t *c, const jv_t *content, int64_t lo, int64_t hi, uint32_t cont);
uint32_t pc_cap_slot(cx_t *c, const jv_t *f);
uint32_t pc_label_slot(const program_t *p, const char *s, uint32_t n);
void pc_check_labels(cx_t *c, const jv_t *f);
uint32_t pc_backtrack_step(cx_t *c, const jv_t *f, uint32_t cont);
uint32_t pc_build(cx_t *c, const jv_t *f, uint32_t cont);

#endif
