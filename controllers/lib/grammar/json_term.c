/* json_term.c - inline `%json{SCHEMA}` terminals: one lexeme whose language is the documents the
 * json controller's matcher (controllers/json) accepts for SCHEMA. Its lexer states are the
 * matcher's configuration sets, interned: state ids >= 1, 0 = dead. */
#include "grammar.h"
#include "../json/matcher.h"

struct gr_json {
  matcher_t *M;
  cset_t *sets;                        /* sets[id - 1], configurations sorted */
  uint32_t n, cap;
  uint32_t *ht, ht_cap;                /* open addressing: id, 0 = empty */
};

static void cset_sort(cset_t *s) {
  for (uint32_t i = 1; i < s->n; i++) {
    cfg_t c = s->c[i];
    uint32_t j = i;
    for (; j > 0; j--) {
      cfg_t d = s->c[j - 1];
      if (d.m < c.m || (d.m == c.m && (d.s < c.s || (d.s == c.s && d.parent <= c.parent)))) break;
      s->c[j] = d;
    }
    s->c[j] = c;
  }
}

static uint32_t cset_hash(const cset_t *s) {
  uint32_t h = 2166136261u ^ s->n;
  for (uint32_t i = 0; i < s->n; i++) h = ((h ^ s->c[i].m) * 16777619u ^ s->c[i].s) * 16777619u ^ s->c[i].parent;
  return h * 0x9E3779B1u;
}

static bool cset_eq(const cset_t *a, const cset_t *b) {
  if (a->n != b->n) return false;
  for (uint32_t i = 0; i < a->n; i++)
    if (a->c[i].m != b->c[i].m || a->c[i].s != b->c[i].s || a->c[i].parent != b->c[i].parent) return false;
  return true;
}

static uint32_t intern(gr_json_t *J, cset_t *s) {
  if (!s->n) return 0;
  cset_sort(s);
  if ((J->n + 1) * 2 > J->ht_cap) {
    uint32_t cap = J->ht_cap ? J->ht_cap * 2 : 256;
    aici_free(J->ht);
    J->ht = aici_calloc(cap, 4);
    J->ht_cap = cap;
    for (uint32_t id = 1; id <= J->n; id++) {
      uint32_t i = cset_hash(&J->sets[id - 1]) & (cap - 1);
      while (J->ht[i]) i = (i + 1) & (cap - 1);
      J->ht[i] = id;
    }
  }
  uint32_t i = cset_hash(s) & (J->ht_cap - 1);
  for (; J->ht[i]; i = (i + 1) & (J->ht_cap - 1))
    if (cset_eq(&J->sets[J->ht[i] - 1], s)) return J->ht[i];
  if (J->n == J->cap) {
    J->cap = J->cap ? J->cap * 2 : 64;
    J->sets = aici_realloc(J->sets, J->cap * sizeof(cset_t));
  }
  J->sets[J->n++] = *s;
  J->ht[i] = J->n;
  return J->n;
}

gr_json_t *gr_json_compile(const char *text, uint32_t len, char **err) {
  const char *why = 0;
  uint32_t at = 0;
  jv_t *schema = jv_parse(text, len, &why, &at);
  if (!schema) { *err = gr_fmt("not JSON: %s at offset %u", why, at); return 0; }
  json_opts_t o = {0};                 /* compact, properties in schema order (as the json controller) */
  compiled_t c = {0};
  char *cerr = 0;
  if (!schema_compile(schema, &o, &c, &cerr)) { *err = cerr; return 0; }
  matcher_t *M = matcher_new(&c, &cerr);
  if (!M) { *err = cerr; return 0; }
  gr_json_t *J = aici_calloc(1, sizeof(gr_json_t));
  J->M = M;
  if (!gr_json_start(J)) { *err = gr_fmt("the schema admits no document"); return 0; }
  return J;
}

uint32_t gr_json_start(gr_json_t *J) {
  cset_t s;
  matcher_start(J->M, &s);
  if (s.n && !s.c[0].s) s.n = 0;
  return intern(J, &s);
}

uint32_t gr_json_step(gr_json_t *J, uint32_t state, uint8_t byte) {
  cset_t out;
  if (!state || !matcher_step(J->M, &J->sets[state - 1], byte, &out)) return 0;
  return intern(J, &out);
}

bool gr_json_accepting(gr_json_t *J, uint32_t state) {
  return state && matcher_accepting(J->M, &J->sets[state - 1]);
}
