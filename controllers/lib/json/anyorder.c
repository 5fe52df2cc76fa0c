/* Objects under the option any_order: keys in any order, each at most once, every required one
 * present. That language needs the set of keys written so far, which no regex of fair size
 * holds, so such an object is a family of machines, one per state (S: keys written, w: anything
 * written yet, an additional property included), each made when a configuration first enters it
 * (matcher.c asks dyn_text for a machine id it reserved but has not compiled):
 *   (S, w) = (?: SEP P_i CALL(S+{i}, 1) | ...   for each listed key i not in S
 *              | SEP A CALL(S, 1)               when additional properties are allowed
 *              | <empty>                        when every required key is in S (and, under
 *                                               minProperties 1, w) )
 * with SEP the comma (and its whitespace) when w. Every call is a tail call (nothing follows
 * it), so the stack does not grow; a machine's successors get their ids when its text is written,
 * and one (object, S, w) always has one id, so documents that reach one key set share its
 * machine. Memory: one small machine (the key texts' DFA rows) per key set a sequence reaches. */
#include "json.h"

typedef struct {
  uint32_t n, words;                   /* entries; words of a key set */
  char **entry;                        /* `"key":value` regexes */
  uint32_t *entry_len;
  uint32_t *req;                       /* the required entries' set */
  char *add;                           /* the additional-property entry (NULL: none) */
  uint32_t add_len;
  char *sep;                           /* the comma between members, with its whitespace */
  bool nonempty;                       /* minProperties 1 */
} dobj_t;

typedef struct { uint32_t obj, id, off; bool w; } dstate_t;

struct dyn {
  dobj_t *obj;
  uint32_t n_obj;
  dstate_t *st;
  uint32_t n_st, cap_st;
  uint32_t *pool, pool_n, pool_cap;    /* key sets, `words` words each */
  uint32_t *ht, ht_cap;                /* (obj, w, set) -> state + 1 */
  uint32_t *of_id, of_id_cap;          /* machine id -> state + 1 */
};

static char *dup(const char *s, uint32_t n) {
  char *t = aici_malloc(n + 1);
  __builtin_memcpy(t, s, n);
  t[n] = 0;
  return t;
}

dyn_t *dyn_new(void) {
  dyn_t *d = aici_calloc(1, sizeof *d);
  d->ht_cap = 64;
  d->ht = aici_calloc(d->ht_cap, 4);
  return d;
}

uint32_t dyn_object(dyn_t *d, uint32_t n, const aici_buf_t *entries, const bool *required, const aici_buf_t *add, bool nonempty,
                    const char *ws) {
  d->obj = aici_realloc(d->obj, (d->n_obj + 1) * sizeof(dobj_t));
  dobj_t *o = &d->obj[d->n_obj];
  o->n = n, o->words = (n + 31) / 32 + !n;
  o->entry = aici_malloc((n + 1) * sizeof(char *)), o->entry_len = aici_malloc((n + 1) * 4);
  o->req = aici_calloc(o->words, 4);
  for (uint32_t i = 0; i < n; i++) {
    o->entry[i] = dup(entries[i].p ? entries[i].p : "", entries[i].n), o->entry_len[i] = entries[i].n;
    if (required[i]) o->req[i >> 5] |= 1u << (i & 31);
  }
  o->add = add ? dup(add->p, add->n) : 0, o->add_len = add ? add->n : 0;
  aici_buf_t sep = {0};
  aici_buf_puts(&sep, ws), aici_buf_putc(&sep, ','), aici_buf_puts(&sep, ws);
  o->sep = sep.p, o->nonempty = nonempty;
  return d->n_obj++;
}

static uint32_t set_hash(uint32_t obj, bool w, const uint32_t *set, uint32_t words) {
  uint32_t h = 2166136261u ^ obj * 31u ^ (uint32_t)w;
  for (uint32_t i = 0; i < words; i++) h = (h ^ set[i]) * 16777619u;
  return h ^ (h >> 15);
}

static void bind(dyn_t *d, uint32_t id, uint32_t state) {
  if (id >= d->of_id_cap) {
    uint32_t cap = d->of_id_cap ? d->of_id_cap : 256;
    while (cap <= id) cap *= 2;
    d->of_id = aici_realloc(d->of_id, cap * 4);
    __builtin_memset(d->of_id + d->of_id_cap, 0, (cap - d->of_id_cap) * 4);
    d->of_id_cap = cap;
  }
  d->of_id[id] = state + 1;
}

/* The state (obj, w, set): its machine id, reserved now when new (0: none left). */
static uint32_t state_id(dyn_t *d, uint32_t obj, bool w, const uint32_t *set, dyn_reserve_fn reserve, void *ctx,
                         uint32_t given_id) {
  uint32_t words = d->obj[obj].words, h = set_hash(obj, w, set, words), k = h & (d->ht_cap - 1);
  for (; d->ht[k]; k = (k + 1) & (d->ht_cap - 1)) {
    const dstate_t *s = &d->st[d->ht[k] - 1];
    if (s->obj == obj && s->w == w && !__builtin_memcmp(d->pool + s->off, set, words * 4)) return s->id;
  }
  uint32_t id = given_id ? given_id : reserve(ctx);
  if (!id) return 0;
  if (d->n_st == d->cap_st) d->st = aici_realloc(d->st, (d->cap_st = d->cap_st ? 2 * d->cap_st : 64) * sizeof(dstate_t));
  if (d->pool_n + words > d->pool_cap) {
    while (d->pool_n + words > d->pool_cap) d->pool_cap = d->pool_cap ? 2 * d->pool_cap : 256;
    d->pool = aici_realloc(d->pool, d->pool_cap * 4);
  }
  __builtin_memcpy(d->pool + d->pool_n, set, words * 4);
  uint32_t i = d->n_st++;
  d->st[i] = (dstate_t){obj, id, d->pool_n, w};
  d->pool_n += words;
  d->ht[k] = i + 1;
  bind(d, id, i);
  if (2 * d->n_st > d->ht_cap) {       /* rehash at half full */
    aici_free(d->ht);
    d->ht_cap *= 2;
    d->ht = aici_calloc(d->ht_cap, 4);
    for (uint32_t j = 0; j < d->n_st; j++) {
      const dstate_t *s = &d->st[j];
      uint32_t q = set_hash(s->obj, s->w, d->pool + s->off, d->obj[s->obj].words) & (d->ht_cap - 1);
      while (d->ht[q]) q = (q + 1) & (d->ht_cap - 1);
      d->ht[q] = j + 1;
    }
  }
  return id;
}

void dyn_bind_start(dyn_t *d, uint32_t obj, uint32_t id) {
  uint32_t empty[1] = {0}, words = d->obj[obj].words;
  uint32_t *set = words > 1 ? aici_calloc(words, 4) : empty;
  state_id(d, obj, false, set, 0, 0, id);
  if (set != empty) aici_free(set);
}

static void call(aici_buf_t *b, uint32_t m) {
  aici_buf_puts(b, "(?:");
  sb_byte(b, CALL_BYTE), sb_byte(b, (uint8_t)(m >> 8)), sb_byte(b, (uint8_t)m);
  aici_buf_putc(b, ')');
}

bool dyn_text(dyn_t *d, uint32_t id, dyn_reserve_fn reserve, void *ctx, aici_buf_t *out) {
  if (!d || id >= d->of_id_cap || !d->of_id[id]) return false;
  dstate_t s = d->st[d->of_id[id] - 1];
  const dobj_t *o = &d->obj[s.obj];
  uint32_t *next = aici_malloc(o->words * 4);
  bool any = false, done = true;
  aici_buf_puts(out, "(?:");
  for (uint32_t i = 0; i <= o->n; i++) {
    bool add = i == o->n;
    const uint32_t *set = d->pool + d->st[d->of_id[id] - 1].off;   /* the pool may move: re-read */
    if (add ? !o->add : (set[i >> 5] >> (i & 31)) & 1) continue;
    __builtin_memcpy(next, set, o->words * 4);
    if (!add) next[i >> 5] |= 1u << (i & 31);
    uint32_t to = state_id(d, s.obj, true, next, reserve, ctx, 0);
    if (!to) continue;                 /* no machine id left: that member is not offered (narrower) */
    if (any) aici_buf_putc(out, '|');
    any = true;
    if (s.w) aici_buf_puts(out, o->sep);
    if (add) aici_buf_putn(out, o->add, o->add_len);
    else aici_buf_putn(out, o->entry[i], o->entry_len[i]);
    call(out, to);
  }
  const uint32_t *set = d->pool + d->st[d->of_id[id] - 1].off;
  for (uint32_t k = 0; k < o->words; k++) done &= (o->req[k] & ~set[k]) == 0;
  if (done && (s.w || !o->nonempty)) aici_buf_puts(out, any ? "|" : "");
  else if (!any) aici_buf_puts(out, "[^\\x00-\\xff]");
  aici_buf_putc(out, ')');
  aici_free(next);
  return true;
}
